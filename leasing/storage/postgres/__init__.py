"""PostgreSQL: `PostgresStorage`, the production database's side of the storage boundary.

Claims lock their candidates with SKIP LOCKED and update them by address
(`ctid`); limited claims, period keys and checkpoint numbering serialize on
transaction-level advisory locks (they work through pgbouncer in transaction
mode); NOTIFY wakes idle workers; large batches of new items are COPYed.
The statements only this database runs are in this package's modules:
`claims` (claims and batch completion), `recovery` (the sweep) and `writes`
(inserts, renewals, checkpoint retention, the console's rollup reads).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction

from ..base import LeaseKey, Pick, Recovered, Statement, Storage
from . import claims, recovery, writes

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from ...sql.fairness import Fairness
    from ...sql.limits import Limits
    from ...sql.new_items import NewItem, RichRow
    from ...sql.renewals import Renewal
    from ...sql.terms import ClaimFilters, LeaseTerms

# SQLSTATEs of a lost or unusable connection: 08 (connection exception), the
# server shutting down or refusing to start one, too many connections, and a
# session left on a server that became read-only (a demoted primary after a
# failover): reconnecting is the remedy for each.
CONNECTION_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53300", "25006")
# Deadlock detected, serialization failure, lock not available (lock_timeout).
CONFLICT_SQLSTATES = ("40P01", "40001", "55P03")
UNIQUE_VIOLATION = "23505"
# Undefined table, undefined column: a database leasing's migrations did not reach.
UNDEFINED_SQLSTATES = ("42P01", "42703")

# Planner settings a claim runs with switched off (`in_claim_order`).
CLAIM_PLANNER_OFF = ("enable_sort", "enable_bitmapscan", "jit")


class PostgresStorage(Storage):
    vendor = "postgresql"
    serves_many_hosts = True
    can_listen = True
    completes_while_claiming = True
    streams_large_batches = True
    estimates_rows = True
    indexes_json_containment = True  # the GIN jsonb_path_ops indexes

    __slots__ = ()

    # --- the database clock ------------------------------------------------------------

    @property
    def now(self) -> str:
        return "statement_timestamp()"

    def clock(self) -> str:
        return "(statement_timestamp() + make_interval(secs => %s))"

    def offset(self, seconds: float) -> Any:
        return float(seconds)

    def earliest(self, a: str, b: str) -> str:
        return f"LEAST({a}, {b})"

    def seconds_between(self, later: str, earlier: str) -> str:
        return f"CAST(round(extract(epoch FROM {later} - {earlier})) AS bigint)"

    def older_than(self, column: str, seconds: str) -> str:
        return f"{column} < statement_timestamp() - make_interval(secs => {seconds})"

    # --- values and lists ---------------------------------------------------------------

    def json(self) -> str:
        return "%s::jsonb"

    def as_text(self, column: str) -> str:
        return column

    def json_array_text(self, *columns: str) -> str:
        return f"json_build_array({', '.join(columns)})::text"

    def in_list(self, column: str, values: Sequence[Any]) -> Statement:
        return f"{column} = ANY(%s)", [list(values)]

    def one_of(self, column: str, values: Sequence[str]) -> Statement:
        return f"{column} = ANY(%s::text[])", [list(values)]

    def keys_table(self, alias: str, values: Sequence[str]) -> Statement:
        return f"unnest(%s::text[]) AS {alias}(key)", [list(values)]

    def rows_table(
        self, alias: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
    ) -> Statement:
        arrays = ", ".join(f"%s::{kind}[]" for _, kind in columns)
        names = ", ".join(name for name, _ in columns)
        params = [[row[i] for row in rows] for i in range(len(columns))]
        return f"unnest({arrays}) AS {alias}({names})", params

    # --- locks ---------------------------------------------------------------------------

    def row_lock(self, mode: str) -> str:
        return f"FOR {mode}"

    def skip_locked(self, mode: str = "UPDATE") -> str:
        return f"FOR {mode} SKIP LOCKED"

    def with_address(self, columns: str) -> str:
        return f"{columns}, ctid"

    def lock_tasks(self, task_ids: Sequence[str]) -> None:
        if task_ids:
            self._run(claims.lock_tasks(list(task_ids)))

    def lock_dependents(self, ids: Sequence[str]) -> None:
        self._run(claims.lock_dependents(self, list(ids)))

    def lock_period_keys(self, keys: Sequence[str]) -> None:
        self._run(claims.lock_period_keys(list(keys)))

    # --- claims --------------------------------------------------------------------------

    def claim_range(self, column: str, values: Sequence[str]) -> Statement:
        return claims.claim_range(column, values)

    def epoch(self, timestamp: str) -> str:
        return f"extract(epoch FROM {timestamp})::float8"

    def wall_clock(self) -> str:
        return "clock_timestamp()"

    def instant(self, epoch: float, *, with_offset: bool = False) -> str:
        stamp = f"to_timestamp({float(epoch)!r})"
        return f"({stamp} + make_interval(secs => %s))" if with_offset else stamp

    def lock_limits(self, limits: Limits) -> None:
        if limits:
            self._run(claims.lock_limits(limits))

    def collate_c(self) -> str:
        return 'COLLATE "C"'

    def not_paused(self, queue_key: str, type_key: str, active_keys: str) -> str:
        return f"NOT (ARRAY[{queue_key}, {type_key}] && ARRAY({active_keys}))"

    def in_claim_order(self, statement: str) -> str:
        """Run a claim with the index's order, whatever the statistics say.

        Right after a burst of enqueues the planner's statistics still count
        the queue as nearly empty, and it plans a claim as a bitmap scan of
        every pending row plus a sort (tens of milliseconds per claim) instead
        of walking the claim index in order and stopping after the batch.
        Sorts and bitmap scans are switched off for this statement only
        (`SET LOCAL` in the same round trip: one implicit transaction, no
        session state, safe behind a transaction pooler). In a transaction
        of the caller's they are restored after the statement; otherwise the
        implicit transaction ends with it and takes them along.
        So is JIT compilation: a switched-off plan node still costs its
        "disable cost" (10^10) when nothing else can do its work (the sort of
        a per-type branched claim), which lifts the plan's cost over
        `jit_above_cost`, and compiling took longer than the claim by two
        orders of magnitude. A claim never runs long enough to gain from JIT.
        Needs client-side parameter binding, Django's default for psycopg.
        """
        if self._server_side_binding():
            return statement
        switch_off = " ".join(f"SET LOCAL {name} = off;" for name in CLAIM_PLANNER_OFF)
        if not self._in_transaction():
            return f"{switch_off} {statement}"
        restore = "; ".join(f"SET LOCAL {name} TO DEFAULT" for name in CLAIM_PLANNER_OFF)
        return f"{switch_off} {statement}; {restore}"

    def without_parallel_workers(self, statement: str) -> str:
        """Run a console read without parallel workers, whatever the planner estimates.

        The pending items per queue and type are planned parallel at a million
        rows, yet the read takes tens of milliseconds: starting workers costs
        about what it saves on an idle server, and on a busy one the page
        waits for CPUs the workers' claims need. As `in_claim_order` does: `SET
        LOCAL` in the same round trip, restored after the statement inside a
        transaction of the caller's; needs client-side parameter binding.
        """
        if self._server_side_binding():
            return statement
        setting = "max_parallel_workers_per_gather"
        if not self._in_transaction():
            return f"SET LOCAL {setting} = 0; {statement}"
        return f"SET LOCAL {setting} = 0; {statement}; SET LOCAL {setting} TO DEFAULT"

    def _in_transaction(self) -> bool:
        """The statement runs inside a transaction that goes on after it.

        Read without connecting (`get_autocommit()` would): a database that
        is down must fail the statement, where the runner reports an outage.
        """
        connection = connections[self.using]
        if connection.in_atomic_block:
            return True
        if connection.connection is None:  # it connects with the configured mode
            return not connection.settings_dict.get("AUTOCOMMIT", True)
        return not connection.autocommit

    def _server_side_binding(self) -> bool:
        options = connections[self.using].settings_dict.get("OPTIONS") or {}
        return bool(options.get("server_side_binding"))

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
        return claims.claim(
            self, holder, n, terms, filters, limits, by_type=by_type, fairness=fairness
        )

    def first_rows_of_each(
        self,
        outer: str,
        columns: str,
        where: Statement,
        order: str,
        limit: Statement,
        flat_limit: Statement,
    ) -> Statement:
        sql = f"""{outer} CROSS JOIN LATERAL (
            SELECT {columns} FROM work_items WHERE {where[0]}
            ORDER BY {order} LIMIT {limit[0]} {self.skip_locked()}
        ) AS c"""
        return sql, [*where[1], *limit[1]]

    def run_claim(self, statement: Statement, limits: Limits) -> list[tuple[Any, ...]]:
        """A claim that may touch a limited key first takes the keys' advisory locks.

        The locks and the claim share one transaction, and the claim's
        snapshot is taken after the locks are granted (`leasing.sql.limits`).
        """
        from ...sql.runner import run, run_rows, translate_db_errors

        if not limits:
            return run_rows(self.using, statement)
        with translate_db_errors(), transaction.atomic(using=self.using):
            run(self.using, claims.lock_limits(limits))
            return run_rows(self.using, statement)

    def complete_and_claim(
        self,
        holder: str,
        done: list[tuple[str, int, str | None]],
        n: int,
        terms: LeaseTerms,
        filters: ClaimFilters,
        limits: Limits,
        *,
        by_type: bool = False,
        fairness: Fairness | None = None,
    ) -> Statement:
        return claims.complete_and_claim(
            self, holder, done, n, terms, filters, limits, by_type=by_type, fairness=fairness
        )

    def complete(self, holder: str, done: list[tuple[str, int, str | None]]) -> set[LeaseKey]:
        from ...sql.runner import run

        rows = run(self.using, claims.complete_batch(self, holder, done))
        return {(row["work_item_id"], row["lease_token"]) for row in rows}

    def renew(
        self, holder: str, renewals: Sequence[Renewal]
    ) -> tuple[dict[LeaseKey, Any], set[LeaseKey]]:
        from ...sql.runner import run

        rows = run(self.using, writes.renew_batch(self, holder, list(renewals)))
        lost = {(r["work_item_id"], r["lease_token"]) for r in rows if r["lost"]}
        renewed = {
            (r["work_item_id"], r["lease_token"]): r["lease_expires_at"]
            for r in rows
            if not r["lost"]
        }
        return renewed, lost

    def notify(self, queue_names: Iterable[str]) -> None:
        queues = sorted(set(queue_names))
        if queues:
            self._run(claims.notify(queues))

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
        return recovery.recover(
            self,
            batch_size,
            fail_types,
            pick=pick,
            checkpoint_ids=checkpoint_ids,
            metadata_json=metadata_json,
            report_items=report_items,
        )

    def trim_checkpoints(self, retention: int, since: datetime | None) -> Statement:
        return writes.trim_checkpoints(self, retention, since)

    # --- new items ----------------------------------------------------------------------

    def insert(self, items: list[NewItem]) -> Callable[[NewItem], datetime | None]:
        from ...sql.runner import run_one, to_datetime, translate_db_errors

        # One statement (below `COPY_THRESHOLD` items; larger plain batches
        # are streamed), so no transaction of ours is needed around it.
        with translate_db_errors():
            row = run_one(self.using, writes.insert(items))
        assert row is not None and row["inserted"] == len(items)  # all or nothing
        created_at = to_datetime(row["created_at"])
        return lambda _item: created_at

    def stream(self, items: Iterable[NewItem]) -> datetime | None:
        return writes.copy(self.using, items)

    def insert_rich(self, rows: list[RichRow], on_conflict: str, returning: str) -> list[Statement]:
        return [writes.insert_rich(rows, on_conflict, returning)]

    # --- the console ---------------------------------------------------------------------

    def finished_groups(
        self, start: datetime, end: datetime | None, step: timedelta, origin: datetime
    ) -> list[dict[str, Any]]:
        from ...sql.runner import run

        return run(self.using, writes.finished_groups(self, start, end, step, origin))

    def estimated_rows(self, queryset: QuerySet[Any]) -> int:
        sql, params = queryset.order_by().query.get_compiler(using=queryset.db).as_sql()
        with connections[queryset.db].cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            return _plan_rows(cursor.fetchone()[0])

    def estimated_rows_many(self, querysets: Sequence[QuerySet[Any]]) -> list[int]:
        """Every EXPLAIN in one round trip (needs client-side parameter binding)."""
        if len(querysets) < 2 or self._server_side_binding():
            return super().estimated_rows_many(querysets)
        compiled = [q.order_by().query.get_compiler(using=q.db).as_sql() for q in querysets]
        sql = "; ".join(f"EXPLAIN (FORMAT JSON) {statement}" for statement, _ in compiled)
        estimates = []
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, [p for _, params in compiled for p in params])
            for _ in compiled:
                estimates.append(_plan_rows(cursor.fetchone()[0]))
                cursor.nextset()
        return estimates

    def replication(self) -> tuple[bool, str | None, str | None, float | None, bool] | None:
        with connections[self.using].cursor() as cursor:
            cursor.execute(writes.REPLICA_SQL)
            in_recovery, replayed, received, age, paused = cursor.fetchone()
        return bool(in_recovery), replayed, received, age, bool(paused)

    def wal_end(self) -> str | None:
        try:
            with connections[self.using].cursor() as cursor:
                cursor.execute(writes.PRIMARY_SQL)
                lsn: str | None = cursor.fetchone()[0]
                return lsn
        except DatabaseError:
            return None

    # --- running statements ---------------------------------------------------------------

    def bound_statements(self, seconds: float) -> None:
        # The session's setting: a row lock held elsewhere cancels the statement on
        # the server rather than leave it waiting after the process is gone.
        timeout = f"{round(seconds * 1000)}ms"
        self._run(("SELECT set_config('statement_timeout', %s, false)", [timeout]))

    def prepare(self, cursor: Any) -> None:
        """Read timestamptz columns with psycopg's own (C) loader on this cursor.

        Django's loader wraps it in Python to pin the time zone, which costs
        several microseconds a value: a claim returns four per row, the biggest
        part of a no-op job's client CPU. `to_datetime` takes either aware value.
        """
        from psycopg.types.datetime import TimestamptzLoader

        cursor.cursor.adapters.register_loader("timestamptz", TimestamptzLoader)

    def next_result_with_rows(self, cursor: Any) -> None:
        # A statement with planner settings before it returns several result
        # sets (`in_claim_order`): its rows are the first set that has any.
        while not self.has_rows(cursor) and cursor.nextset():
            pass

    def has_rows(self, cursor: Any) -> bool:
        """Without building `description` (psycopg makes an object per column)."""
        from psycopg import pq

        result = cursor.cursor.pgresult
        return result is not None and (
            result.nfields > 0 or result.status == pq.ExecStatus.TUPLES_OK
        )

    # --- driver errors -------------------------------------------------------------------

    @classmethod
    def raised(cls, error: BaseException) -> bool:
        return getattr(error, "sqlstate", "missing") != "missing"  # psycopg's

    @classmethod
    def lacks_schema(cls, error: BaseException) -> bool:
        return getattr(error, "sqlstate", None) in UNDEFINED_SQLSTATES

    @classmethod
    def is_lock_conflict(cls, error: BaseException) -> bool:
        return getattr(error, "sqlstate", None) in CONFLICT_SQLSTATES

    @classmethod
    def is_unavailable(cls, error: BaseException) -> bool:
        # No SQLSTATE: the server never answered (refused, reset, timed out).
        sqlstate = getattr(error, "sqlstate", None)
        return sqlstate is None or str(sqlstate).startswith(CONNECTION_SQLSTATES)

    @classmethod
    def breaks_unique(cls, error: BaseException, index: str, columns: str) -> bool:
        # psycopg names the index.
        return (
            getattr(error, "sqlstate", None) == UNIQUE_VIOLATION
            and getattr(getattr(error, "diag", None), "constraint_name", None) == index
        )

    def _run(self, statement: Statement) -> None:
        from ...sql.runner import run

        run(self.using, statement)


def _plan_rows(plan: Any) -> int:
    """The rows an EXPLAIN (FORMAT JSON) expects its statement to return."""
    if isinstance(plan, str | bytes):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


__all__ = ["PostgresStorage"]
