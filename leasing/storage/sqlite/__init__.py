"""SQLite: `SQLiteStorage`, the embedded database's side of the storage boundary.

One writer at a time: an IMMEDIATE transaction takes the database's only
write lock up front, so a claim, a renewal or a recovery re-checks its rows'
status in the statement that changes them and needs no row lock, and nothing
serializes on an advisory lock. Nobody listens for notifications: idle
workers poll. Datetimes are ISO text in UTC; a list parameter is JSON text
read with `json_each`. The statements only this database runs are in
`statements`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from ...sql.rollups import bucket_of
from ...sql.runner import run, run_each, to_datetime, translate_db_errors
from ...states import WorkItemStatus
from ..base import LeaseKey, Pick, Recovered, Statement, Storage
from . import statements as sql
from .recovery import recover

if TYPE_CHECKING:
    from ...sql.fairness import Fairness
    from ...sql.limits import Limits
    from ...sql.new_items import NewItem, RichRow
    from ...sql.renewals import Renewal
    from ...sql.terms import ClaimFilters, LeaseTerms

_UNAVAILABLE = ("unable to open", "disk i/o error")
_BUSY = ("database is locked", "database table is locked", "database is busy")
# Datetimes are ISO text in UTC. `%%` because Django runs every statement
# through parameter substitution.
_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
# The busy timeout a writer waits for the write lock. Claims, renewals,
# checkpoints and completions of every worker thread queue on that one lock;
# Python's default (5 s) is too short under a burst of checkpoints.
MIN_TIMEOUT = 20.0


def json_list(values: Sequence[Any]) -> str:
    """A list as one JSON parameter (read with json_each)."""
    return json.dumps(list(values), separators=(",", ":"))


class SQLiteStorage(Storage):
    vendor = "sqlite"

    __slots__ = ()

    # --- the database clock ------------------------------------------------------------

    @property
    def now(self) -> str:
        return _NOW

    def clock(self) -> str:
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"

    def offset(self, seconds: float) -> Any:
        return f"{float(seconds):+.6f} seconds"

    def earliest(self, a: str, b: str) -> str:
        return f"MIN({a}, {b})"

    def seconds_between(self, later: str, earlier: str) -> str:
        return f"CAST(round((julianday({later}) - julianday({earlier})) * 86400) AS INTEGER)"

    def older_than(self, column: str, seconds: str) -> str:
        return f"julianday({column}) < julianday('now') - ({seconds}) / 86400.0"

    def datetime_param(self, value: datetime | None) -> Any:
        if value is None:
            return None
        return connections[self.using].ops.adapt_datetimefield_value(value)

    # --- values and lists ---------------------------------------------------------------

    def json(self) -> str:
        return "%s"

    def as_text(self, column: str) -> str:
        return f"CAST({column} AS TEXT)"

    def json_array_text(self, *columns: str) -> str:
        return f"json_array({', '.join(f'json({c})' for c in columns)})"

    def in_list(self, column: str, values: Sequence[Any]) -> Statement:
        return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)

    def one_of(self, column: str, values: Sequence[str]) -> Statement:
        return f"{column} IN (SELECT value FROM json_each(%s))", [json_list(values)]

    def keys_table(self, alias: str, values: Sequence[str]) -> Statement:
        return f"(SELECT value AS key FROM json_each(%s)) AS {alias}", [json_list(values)]

    def rows_table(
        self, alias: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
    ) -> Statement:
        picked = ", ".join(
            f"json_extract(value, '$[{i}]') AS {name}" for i, (name, _) in enumerate(columns)
        )
        rows_json = json_list([list(row) for row in rows])
        return f"(SELECT {picked} FROM json_each(%s)) AS {alias}", [rows_json]

    # --- locks (one writer at a time: none needed) ---------------------------------------

    def row_lock(self, mode: str) -> str:
        return ""

    def skip_locked(self, mode: str = "UPDATE") -> str:
        return ""

    def with_address(self, columns: str) -> str:
        return columns

    # --- claims --------------------------------------------------------------------------

    def claim_range(self, column: str, values: Sequence[str]) -> Statement:
        return "", []

    def epoch(self, timestamp: str) -> str:
        return f"((julianday({timestamp}) - 2440587.5) * 86400.0)"

    def wall_clock(self) -> str:
        return _NOW

    def instant(self, epoch: float, *, with_offset: bool = False) -> str:
        offset = ", %s" if with_offset else ""
        return f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', {float(epoch)!r}, 'unixepoch'{offset})"

    def not_paused(self, queue_key: str, type_key: str, active_keys: str) -> str:
        return f"({queue_key}) NOT IN ({active_keys}) AND ({type_key}) NOT IN ({active_keys})"

    def claim(
        self,
        holder: str,
        n: int,
        terms: LeaseTerms,
        filters: ClaimFilters,
        limits: Limits,
        *,
        by_type: bool = False,
        fairness: Fairness | None = None,
    ) -> Statement:
        return sql.claim(self, holder, n, terms, filters, limits, fairness=fairness)

    def first_rows_of_each(
        self,
        outer: str,
        columns: str,
        where: Statement,
        order: str,
        limit: Statement,
        flat_limit: Statement,
    ) -> Statement:
        # A LIMIT cannot read the outer row here, and nothing is locked (one writer).
        statement = f"""{outer} JOIN (SELECT {columns} FROM work_items) AS c
            ON c.work_item_id IN (
                SELECT work_item_id FROM work_items WHERE {where[0]}
                ORDER BY {order} LIMIT {flat_limit[0]}
            )"""
        return statement, [*where[1], *flat_limit[1]]

    def run_claim(self, statement: Statement, limits: Limits) -> list[tuple[Any, ...]]:
        from ...sql.runner import run_rows

        return run_rows(self.using, statement)

    def complete(self, holder: str, done: list[tuple[str, int, str | None]]) -> set[LeaseKey]:
        from ...sql.work_items import complete_one

        rows = run_each(self.using, (complete_one(self, holder, *row) for row in done))
        return {(row["work_item_id"], row["lease_token"]) for row in rows}

    def renew(
        self, holder: str, renewals: Sequence[Renewal]
    ) -> tuple[dict[LeaseKey, Any], set[LeaseKey]]:
        rows = run_each(self.using, (sql.renew_lazily(self, holder, r) for r in renewals))
        renewed = {(r["work_item_id"], r["lease_token"]): r["lease_expires_at"] for r in rows}
        # One writer at a time: every lease not renewed is lost.
        lost = {(r.work_item_id, r.token) for r in renewals} - set(renewed)
        return renewed, lost

    # --- the sweep -----------------------------------------------------------------------

    def recover(
        self,
        batch_size: int,
        fail_types: list[str],
        *,
        pick: Pick,
        checkpoint_ids: Callable[[int], list[str]] | None,
        metadata_json: str,
        report_items: bool,
    ) -> Recovered:
        return recover(
            self,
            batch_size,
            fail_types,
            pick=pick,
            checkpoint_ids=checkpoint_ids,
            metadata_json=metadata_json,
        )

    def trim_checkpoints(self, retention: int, since: datetime | None) -> Statement:
        return sql.trim_checkpoints(self, retention, since)

    # --- new items ----------------------------------------------------------------------

    def insert(self, items: list[NewItem]) -> Callable[[NewItem], datetime | None]:
        stamps: dict[str, datetime | None] = {}
        with translate_db_errors(), transaction.atomic(using=self.using):
            for start in range(0, len(items), sql.ROWS_PER_INSERT):
                chunk = items[start : start + sql.ROWS_PER_INSERT]
                for row in run(self.using, sql.insert(self, chunk)):
                    stamps[row["work_item_id"]] = to_datetime(row["created_at"])
        return lambda item: stamps[item.work_item_id]

    def insert_rich(self, rows: list[RichRow], on_conflict: str, returning: str) -> list[Statement]:
        return [
            sql.insert_rich(
                self, rows[start : start + sql.RICH_ROWS_PER_INSERT], on_conflict, returning
            )
            for start in range(0, len(rows), sql.RICH_ROWS_PER_INSERT)
        ]

    # --- the console ---------------------------------------------------------------------

    def finished_groups(
        self, start: datetime, end: datetime | None, step: timedelta, origin: datetime
    ) -> list[dict[str, Any]]:
        """One group per item, bucketed here (SQLite has no `date_bin`)."""
        items = run(self.using, sql.finished_items(self, start, end))
        return [_grouped(item, step, origin) for item in items]

    # --- driver errors -------------------------------------------------------------------

    @classmethod
    def raised(cls, error: BaseException) -> bool:
        return type(error).__module__.startswith("sqlite3")

    @classmethod
    def is_lock_conflict(cls, error: BaseException) -> bool:
        return any(marker in str(error).lower() for marker in _BUSY)

    @classmethod
    def is_unavailable(cls, error: BaseException) -> bool:
        return any(marker in str(error).lower() for marker in _UNAVAILABLE)

    @classmethod
    def lacks_schema(cls, error: BaseException) -> bool:
        return str(error).startswith(("no such table", "no such column"))

    @classmethod
    def breaks_unique(cls, error: BaseException, index: str, columns: str) -> bool:
        # SQLite names the columns: "UNIQUE constraint failed: t.a, t.b".
        return str(error).endswith(f"UNIQUE constraint failed: {columns}")

    def option_problems(self) -> list[str]:
        """What the alias's OPTIONS lack for concurrent workers (empty: nothing)."""
        return option_problems(connections[self.using].settings_dict.get("OPTIONS") or {})


def _grouped(item: Mapping[str, Any], step: timedelta, origin: datetime) -> dict[str, Any]:
    """One finished item as a group of one (the shape PostgreSQL's groups have)."""
    completed_at = to_datetime(item["completed_at"])
    assert completed_at is not None
    acquired_at = to_datetime(item["lease_acquired_at"])
    run_time = None
    if item["status"] == WorkItemStatus.COMPLETED and acquired_at is not None:
        run_time = max(0.0, (completed_at - acquired_at).total_seconds())
    return {
        "bucket": origin + (completed_at - origin) // step * step,
        "quarter": completed_at.minute // 15,
        "queue_name": item["queue_name"],
        "work_type": item["work_type"],
        "status": item["status"],
        "retry_count": item["retry_count"],
        "run_bucket": None if run_time is None else bucket_of(run_time),
        "n": 1,
        "run_seconds": run_time or 0.0,
    }


def option_problems(options: Mapping[str, Any]) -> list[str]:
    """What a SQLite database's OPTIONS lack for concurrent workers (empty: nothing)."""
    problems = []
    mode = options.get("transaction_mode")
    if not isinstance(mode, str) or mode.upper() != "IMMEDIATE":
        problems.append(
            'transaction_mode "IMMEDIATE" (a deferred transaction that must upgrade its read '
            'lock fails at once with "database is locked", whatever the timeout)'
        )
    init_command = options.get("init_command") or ""
    pragmas = re.sub(r"\s+", "", str(init_command)).lower()
    busy_ms = re.search(r"busy_timeout=(\d+)", pragmas)
    timeout = options.get("timeout", 5.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        timeout = 0.0
    if busy_ms is not None:
        timeout = max(timeout, int(busy_ms.group(1)) / 1000)
    if timeout < MIN_TIMEOUT:
        problems.append(
            f"a busy timeout of at least {MIN_TIMEOUT:g} s (it is {timeout:g} s: writers "
            "that wait longer for the lock fail)"
        )
    if "journal_mode=wal" not in pragmas:
        problems.append(
            "WAL journal mode (PRAGMA journal_mode=WAL in init_command: without it every "
            "reader blocks the writers)"
        )
    return problems


__all__ = ["SQLiteStorage", "json_list"]
