"""The database's own record of a fault run, and reading it back.

`install()` adds, on the run's throwaway database only, a trigger on
`work_items` that appends every change of an item's status, token or lease
expiry to `fault_journal`, in the transaction that made it: a change is in
the journal exactly when it committed, whatever happened to the process that
made it. Renewals that only record a heartbeat (expiry unchanged) are left
out. The HA tests' ledger (`ha_ledger`, `tests.ha.app.handlers`) holds the
`run_once(atomic=True)` effects.

Times are integer microseconds since the epoch (exact: `extract` returns numeric).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg

from tests.ha.app.handlers import LEDGER_DDL

from .checker import Evidence
from .records import Change, Edge, Effect, FinalItem, Record


def _us(expression: str) -> str:
    return f"(extract(epoch FROM {expression}) * 1000000)::bigint"


JOURNAL_DDL = f"""
CREATE TABLE fault_journal (
    seq bigserial PRIMARY KEY,
    at_us bigint NOT NULL,
    stmt_us bigint NOT NULL,
    op text NOT NULL,
    item text NOT NULL,
    work_type text NOT NULL,
    queue text NOT NULL,
    old_status text, new_status text,
    old_token bigint, new_token bigint,
    old_holder text, new_holder text,
    old_expires_us bigint, new_expires_us bigint,
    deadline_us bigint, acquired_us bigint
);

CREATE FUNCTION fault_journal_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    row_now work_items;
BEGIN
    row_now := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    INSERT INTO fault_journal (
        at_us, stmt_us, op, item, work_type, queue,
        old_status, new_status, old_token, new_token, old_holder, new_holder,
        old_expires_us, new_expires_us, deadline_us, acquired_us)
    VALUES (
        {_us("clock_timestamp()")}, {_us("statement_timestamp()")}, TG_OP,
        row_now.work_item_id, row_now.work_type, row_now.queue_name,
        CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE OLD.status END,
        CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE NEW.status END,
        CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE OLD.lease_token END,
        CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE NEW.lease_token END,
        CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE OLD.lease_holder END,
        CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE NEW.lease_holder END,
        CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE {_us("OLD.lease_expires_at")} END,
        CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE {_us("NEW.lease_expires_at")} END,
        {_us("row_now.lease_deadline_at")}, {_us("row_now.lease_acquired_at")});
    RETURN NULL;
END $$;

CREATE TRIGGER fault_journal_rows AFTER INSERT OR DELETE ON work_items
    FOR EACH ROW EXECUTE FUNCTION fault_journal_write();
CREATE TRIGGER fault_journal_changes AFTER UPDATE ON work_items
    FOR EACH ROW WHEN (
        OLD.status IS DISTINCT FROM NEW.status
        OR OLD.lease_token IS DISTINCT FROM NEW.lease_token
        OR OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at)
    EXECUTE FUNCTION fault_journal_write();
"""


def install(dsn: str) -> None:
    """Create the journal (with its triggers) and the effect ledger."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(JOURNAL_DDL)
        conn.execute(LEDGER_DDL)


def _rows(conn: psycopg.Connection, sql: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql).fetchall()


def load_changes(conn: psycopg.Connection) -> list[Change]:
    rows = _rows(
        conn,
        "SELECT seq, at_us, stmt_us, op, item, work_type, queue, old_status, new_status, "
        "old_token, new_token, old_holder, new_holder, old_expires_us, new_expires_us, "
        "deadline_us, acquired_us FROM fault_journal ORDER BY seq",
    )
    return [Change(*row) for row in rows]


def load_items(conn: psycopg.Connection) -> dict[str, FinalItem]:
    rows = _rows(
        conn,
        "SELECT work_item_id, work_type, queue_name, status, lease_token, output_data, "
        "input_data -> '_schedule' ->> 'tick', input_data -> '_schedule' ->> 'name' "
        "FROM work_items",
    )
    return {row[0]: FinalItem(*row) for row in rows}


def load_effects(conn: psycopg.Connection) -> list[Effect]:
    rows = _rows(
        conn,
        f"SELECT id, effect_key, work_item_id, lease_token, worker_id, {_us('created_at')} "
        "FROM ha_ledger ORDER BY id",
    )
    return [Effect(*row) for row in rows]


def load_edges(conn: psycopg.Connection) -> list[Edge]:
    rows = _rows(conn, "SELECT dependency_id, dependent_id FROM work_item_dependencies")
    return [Edge(*row) for row in rows]


def load_records(directory: Path) -> list[Record]:
    """Every process's signal records (a line cut short by SIGKILL is skipped)."""
    records = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                records.append(Record.from_json(json.loads(line)))
            except (ValueError, KeyError):
                continue
    return records


def load_evidence(dsn: str, records_dir: Path) -> Evidence:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return Evidence(
            items=load_items(conn),
            changes=load_changes(conn),
            effects=load_effects(conn),
            records=load_records(records_dir),
            edges=load_edges(conn),
            observed_at=conn.execute(f"SELECT {_us('clock_timestamp()')}").fetchone()[0],
        )


DUMPED = {
    "fault_journal": "SELECT * FROM fault_journal ORDER BY seq",
    "work_items": (
        "SELECT work_item_id, task_id, work_type, queue_name, status, lease_token, "
        "retry_count, max_retries, interruptions, unique_key, unique_scope, run_after, "
        "created_at, completed_at, output_data, error_message FROM work_items "
        "ORDER BY work_item_id"
    ),
    "ha_ledger": "SELECT * FROM ha_ledger ORDER BY id",
}


def dump(dsn: str, directory: Path) -> None:
    """The journal, the items and the ledger as CSV files, kept after the cluster goes."""
    directory.mkdir(parents=True, exist_ok=True)
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        for name, sql in DUMPED.items():
            path = directory / f"{name}.csv"
            with path.open("wb") as out, cur.copy(f"COPY ({sql}) TO STDOUT CSV HEADER") as copy:
                for data in copy:
                    out.write(data)
