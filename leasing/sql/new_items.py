"""Statements that add work items, and the NOTIFY that wakes idle workers.

The rows arrive validated (`leasing.services.enqueue`; a COPY's rows may be
validated as the COPY reads them, and a bad one aborts it). PostgreSQL inserts a
batch with one `INSERT ... SELECT unnest(...)` (a fixed number of parameters
whatever the batch size) or, from `COPY_THRESHOLD` rows on, one `COPY`;
SQLite with multi-row VALUES under its bound-variable limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from itertools import chain
from typing import Any

from django.db import connections

from .. import transitions as T
from .dialect import Dialect
from .runner import Statement, to_datetime

NOTIFY_CHANNEL = "leasing_enqueue"
NEW_STATUS = T.ENQUEUE.target()
# From this many items on, PostgreSQL loads them with one COPY statement: about
# twice as fast as INSERT ... SELECT unnest() for large batches, slower for a few.
COPY_THRESHOLD = 2000
# SQLite binds at most 32766 parameters; a row binds eight.
SQLITE_ROWS_PER_INSERT = 4000


@dataclass(frozen=True, slots=True)
class NewItem:
    """One validated row to insert."""

    work_item_id: str
    task_id: str
    work_type: str
    input_json: str | None
    input_data: Any
    priority: int
    max_retries: int
    run_after: datetime | None
    queue_name: str
    # Unique enqueue (`sql.unique`): the key, its scope and, for a period, its length.
    unique_key: str | None = None
    unique_scope: str | None = None
    unique_seconds: float | None = None
    # Dependencies: work item ids (str) and positions in the same batch (int).
    depends_on: tuple[str | int, ...] = ()
    on_dependency_failure: str | None = None

    @property
    def plain(self) -> bool:
        """Neither a unique key nor dependencies: the bulk INSERT (or COPY) path."""
        return self.unique_key is None and not self.depends_on


_COLUMNS = (
    "work_item_id, task_id, work_type, status, priority, lease_token, retry_count, "
    "max_retries, run_after, queue_name, input_data"
)


def insert_postgres(items: list[NewItem]) -> Statement:
    """One INSERT for the whole batch that also wakes idle workers of its queues.

    Returns one row: the count and the creation time. Being one statement, it
    is atomic by itself: outside a transaction it is one round trip with its
    commit, where BEGIN, INSERT, NOTIFY and COMMIT took four (a row is
    claimable only once that commit returns, so each round trip between the
    INSERT and it delayed the item's start). The NOTIFY is delivered at commit,
    and not at all if the INSERT fails.
    """
    # Every row gets the same statement_timestamp() (the columns' default),
    # so one row comes back, not n.
    sql = f"""
        WITH inserted AS (
            INSERT INTO work_items ({_COLUMNS})
            SELECT v.id, v.task_id, v.work_type, {NEW_STATUS}, v.priority, 0, 0,
                   v.max_retries, v.run_after, v.queue_name, v.input::jsonb
            FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::int[],
                        %s::timestamptz[], %s::text[], %s::text[])
                 AS v(id, task_id, work_type, priority, max_retries, run_after, queue_name, input)
            RETURNING 1
        )
        SELECT count(*) AS inserted, statement_timestamp() AS created_at,
               (SELECT count(pg_notify(%s, q)) FROM unnest(%s::text[]) AS q) AS notified
        FROM inserted
    """
    params: list[Any] = [
        [i.work_item_id for i in items],
        [i.task_id for i in items],
        [i.work_type for i in items],
        [i.priority for i in items],
        [i.max_retries for i in items],
        [i.run_after for i in items],
        [i.queue_name for i in items],
        [i.input_json for i in items],
        NOTIFY_CHANNEL,
        sorted({i.queue_name for i in items}),
    ]
    return sql, params


def copy_postgres(using: str, items: Iterable[NewItem]) -> datetime | None:
    """PostgreSQL: load the batch with one COPY; returns the shared creation time.

    `items` may be a generator that validates as it goes: an exception from it
    aborts the COPY (psycopg sends the server a CopyFail) and propagates.
    """
    rows = iter(items)
    # The first row is taken before the COPY: its id reads the creation time
    # back, without a check on every row of the loop.
    first = next(rows, None)
    if first is None:
        return None
    connection = connections[using]
    connection.ensure_connection()
    # The driver's own cursor (Django's has no COPY); errors still become Django's.
    with connection.wrap_database_errors, connection.connection.cursor() as cursor:
        with cursor.copy(f"COPY work_items ({_COLUMNS}) FROM STDIN") as copy:
            for i in chain((first,), rows):
                copy.write_row(
                    (
                        i.work_item_id,
                        i.task_id,
                        i.work_type,
                        T.ENQUEUE.targets[0],
                        i.priority,
                        0,
                        0,
                        i.max_retries,
                        i.run_after,
                        i.queue_name,
                        i.input_json,
                    )
                )
        # `prepare=False`: no server-side prepared statement (transaction poolers drop them).
        cursor.execute(
            "SELECT created_at FROM work_items WHERE work_item_id = %s",
            [first.work_item_id],
            prepare=False,
        )
        row = cursor.fetchone()
    return to_datetime(row[0]) if row else None


def insert_sqlite(d: Dialect, items: list[NewItem]) -> Statement:
    """SQLite: one multi-row INSERT (at most `SQLITE_ROWS_PER_INSERT` rows)."""
    values = ", ".join(
        f"(%s, %s, %s, {NEW_STATUS}, %s, 0, 0, %s, %s, %s, %s, {d.now}, {d.now})" for _ in items
    )
    params: list[Any] = []
    for i in items:
        params += [
            i.work_item_id,
            i.task_id,
            i.work_type,
            i.priority,
            i.max_retries,
            d.datetime_param(i.run_after),
            i.queue_name,
            i.input_json,
        ]
    sql = (
        f"INSERT INTO work_items ({_COLUMNS}, created_at, updated_at) VALUES {values} "
        "RETURNING work_item_id, created_at"
    )
    return sql, params


# --- items with a unique key or dependencies ------------------------------------------------

_RICH_COLUMNS = (
    f"{_COLUMNS}, unique_key, unique_scope, unique_until, dependencies_left, has_dependents, "
    "on_dependency_failure"
)


@dataclass(frozen=True, slots=True)
class RichRow:
    """A row with a unique key or dependencies, and its provisional dependency columns."""

    item: NewItem
    dependencies_left: int
    has_dependents: bool


def insert_rich_postgres(rows: list[RichRow], on_conflict: str, returning: str) -> Statement:
    """PostgreSQL: insert the rows, skipping those whose unique key is held (`on_conflict`).

    Returns the `returning` columns of each row inserted.
    """
    sql = f"""
        INSERT INTO work_items ({_RICH_COLUMNS})
        SELECT v.id, v.task_id, v.work_type, {NEW_STATUS}, v.priority, 0, 0,
               v.max_retries, v.run_after, v.queue_name, v.input::jsonb,
               v.unique_key, v.unique_scope,
               CASE WHEN v.period IS NULL THEN NULL
                    ELSE statement_timestamp() + make_interval(secs => v.period) END,
               v.dependencies_left, v.has_dependents, v.on_failure
        FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::int[],
                    %s::timestamptz[], %s::text[], %s::text[], %s::text[], %s::text[],
                    %s::float8[], %s::int[], %s::boolean[], %s::text[])
             AS v(id, task_id, work_type, priority, max_retries, run_after, queue_name, input,
                  unique_key, unique_scope, period, dependencies_left, has_dependents,
                  on_failure)
        {on_conflict}
        RETURNING {returning}
    """
    items = [r.item for r in rows]
    params: list[Any] = [
        [i.work_item_id for i in items],
        [i.task_id for i in items],
        [i.work_type for i in items],
        [i.priority for i in items],
        [i.max_retries for i in items],
        [i.run_after for i in items],
        [i.queue_name for i in items],
        [i.input_json for i in items],
        [i.unique_key for i in items],
        [i.unique_scope for i in items],
        [i.unique_seconds for i in items],
        [r.dependencies_left for r in rows],
        [r.has_dependents for r in rows],
        [i.on_dependency_failure for i in items],
    ]
    return sql, params


# SQLite binds at most 32766 parameters; a rich row binds fifteen.
SQLITE_RICH_ROWS_PER_INSERT = 2000


def insert_rich_sqlite(
    d: Dialect, rows: list[RichRow], on_conflict: str, returning: str
) -> Statement:
    """SQLite: `insert_rich_postgres()` as one multi-row INSERT (at most
    `SQLITE_RICH_ROWS_PER_INSERT` rows)."""
    values = ", ".join(
        f"(%s, %s, %s, {NEW_STATUS}, %s, 0, 0, %s, %s, %s, %s, "
        f"%s, %s, CASE WHEN %s IS NULL THEN NULL ELSE {d.clock()} END, %s, %s, %s, "
        f"{d.now}, {d.now})"
        for _ in rows
    )
    params: list[Any] = []
    for r in rows:
        i = r.item
        period = None if i.unique_seconds is None else d.offset(i.unique_seconds)
        params += [
            i.work_item_id,
            i.task_id,
            i.work_type,
            i.priority,
            i.max_retries,
            d.datetime_param(i.run_after),
            i.queue_name,
            i.input_json,
            i.unique_key,
            i.unique_scope,
            period,
            period,
            r.dependencies_left,
            r.has_dependents,
            i.on_dependency_failure,
        ]
    sql = (
        f"INSERT INTO work_items ({_RICH_COLUMNS}, created_at, updated_at) VALUES {values} "
        f"{on_conflict} RETURNING {returning}"
    )
    return sql, params


def notify(queue_names: Iterable[str]) -> Statement:
    """PostgreSQL: wake idle workers of these queues (delivered when the transaction commits)."""
    return (
        "SELECT pg_notify(%s, q) FROM unnest(%s::text[]) AS q",
        [NOTIFY_CHANNEL, sorted(set(queue_names))],
    )
