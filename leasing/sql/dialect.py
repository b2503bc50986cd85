"""SQL fragments that differ between PostgreSQL and SQLite.

Every lease time is the database clock: `statement_timestamp()` on
PostgreSQL, `'now'` on SQLite (both fixed for the whole statement). An offset
from it is one helper, `Dialect.clock()`, whose parameter carries its sign, so
"now plus a lease" and "now minus an age" cannot be confused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections

from ..exceptions import LeasingConfigurationError

# SQLite keeps datetimes as ISO text in UTC. `%%` because Django runs every
# statement through parameter substitution.
_SQLITE_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
# PostgreSQL planner settings a claim runs with switched off (`Dialect.in_claim_order`).
CLAIM_PLANNER_OFF = ("enable_sort", "enable_bitmapscan", "jit")


class Dialect:
    """SQL fragments for one database alias's vendor."""

    __slots__ = ("is_postgres", "using", "vendor")

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self.vendor = connections[using].vendor
        self.is_postgres = self.vendor == "postgresql"
        if self.vendor not in ("postgresql", "sqlite"):
            # Other backends lack SKIP LOCKED or RETURNING the way the
            # statements use them; failing loudly beats double-claiming.
            raise LeasingConfigurationError(
                f"The leasing app supports PostgreSQL and SQLite, not {self.vendor!r}."
            )

    @property
    def now(self) -> str:
        """The database clock, fixed for the statement."""
        return "statement_timestamp()" if self.is_postgres else _SQLITE_NOW

    def clock(self) -> str:
        """The database clock moved by a signed number of seconds, given as one parameter.

        Pair it with `offset(seconds)`: positive is the future, negative the past.
        """
        if self.is_postgres:
            return "(statement_timestamp() + make_interval(secs => %s))"
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"

    def offset(self, seconds: float) -> Any:
        """The parameter of `clock()` for `seconds` (negative: before now)."""
        if self.is_postgres:
            return float(seconds)
        return f"{float(seconds):+.6f} seconds"

    def earliest(self, a: str, b: str) -> str:
        """The earlier of two timestamps (NULL-safe on neither side: both must be set)."""
        return f"LEAST({a}, {b})" if self.is_postgres else f"MIN({a}, {b})"

    def seconds_between(self, later: str, earlier: str) -> str:
        """Whole seconds from `earlier` to `later`, as an integer expression."""
        if self.is_postgres:
            return f"CAST(round(extract(epoch FROM {later} - {earlier})) AS bigint)"
        return f"CAST(round((julianday({later}) - julianday({earlier})) * 86400) AS INTEGER)"

    def older_than(self, column: str, seconds: str) -> str:
        """`column` is more than `seconds` (an SQL expression) before now."""
        if self.is_postgres:
            return f"{column} < statement_timestamp() - make_interval(secs => {seconds})"
        return f"julianday({column}) < julianday('now') - ({seconds}) / 86400.0"

    def datetime_param(self, value: datetime | None) -> Any:
        """A datetime as this database compares it (naive UTC text on SQLite)."""
        if value is None or self.is_postgres:
            return value
        return connections[self.using].ops.adapt_datetimefield_value(value)

    def json(self) -> str:
        """A placeholder for JSON text, stored as jsonb on PostgreSQL."""
        return "%s::jsonb" if self.is_postgres else "%s"

    def in_list(self, column: str, values: list[Any]) -> tuple[str, list[Any]]:
        """`column IN (...)` for a non-empty list of values."""
        if self.is_postgres:
            return f"{column} = ANY(%s)", [list(values)]
        return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)

    def in_claim_order(self, statement: str) -> str:
        """PostgreSQL: run a claim with the index's order, whatever the statistics say.

        Right after a burst of enqueues the planner's statistics still count
        the queue as nearly empty, and it plans a claim as a bitmap scan of
        every pending row plus a sort (tens of milliseconds per claim) instead
        of walking the claim index in order and stopping after the batch.
        Sorts and bitmap scans are switched off for this statement only
        (`SET LOCAL` in the same round trip: one implicit transaction, no
        session state, safe behind a transaction pooler). In a transaction
        of the caller's they are restored after the statement; otherwise the
        implicit transaction ends with it and takes them along, and three
        more statements would only cost the round trip time.
        So is JIT compilation: a switched-off plan node still costs its
        "disable cost" (10^10) when nothing else can do its work (the sort of
        a per-type branched claim, `sql.candidates`), which lifts the plan's
        cost over `jit_above_cost`, and compiling it took 500-700 ms on a
        claim that runs in 2 ms. A claim never runs long enough to gain from JIT.
        Needs client-side parameter binding, Django's default for psycopg.
        """
        if not self.is_postgres or self._server_side_binding():
            return statement
        switch_off = " ".join(f"SET LOCAL {name} = off;" for name in CLAIM_PLANNER_OFF)
        if not self._in_transaction():
            return f"{switch_off} {statement}"
        restore = "; ".join(f"SET LOCAL {name} TO DEFAULT" for name in CLAIM_PLANNER_OFF)
        return f"{switch_off} {statement}; {restore}"

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

    def lock_skip_locked(self, mode: str = "UPDATE") -> str:
        """Row locks that concurrent lockers skip (PostgreSQL; SQLite has one writer)."""
        return f"FOR {mode} SKIP LOCKED" if self.is_postgres else ""
