"""`Storage`: the one interface behind which each database keeps its differences.

Two kinds of members:

* fragments, SQL text the catalogue composes into its statements: the
  database clock (`now`, `clock()` with `offset()`), list parameters, row
  locks, casts;
* operations, what each database does its own way: a claim, completing a
  batch, renewals, the sweep's recovery of a batch, inserting new items,
  waking idle workers, locks that only PostgreSQL needs, the console's
  estimates.

Every lease time is the database clock, fixed for the statement.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from ..sql.fairness import Fairness
    from ..sql.limits import Limits
    from ..sql.new_items import NewItem, RichRow
    from ..sql.renewals import Renewal
    from ..sql.terms import ClaimFilters, LeaseTerms

Statement = tuple[str, list[Any]]
LeaseKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Pick:
    """Which expired leases a recovery takes: all but `exclude`, or `only` one."""

    exclude: tuple[str, ...] = ()
    only: str | None = None


@dataclass(frozen=True, slots=True)
class Recovered:
    """What one recovery of a batch of expired leases did (inside its transaction)."""

    found: int = 0  # expired rows taken
    requeued: int = 0
    failed: int = 0  # failed for good
    cancelled: int = 0  # asked to stop (`leasing.cancel()`): ended cancelled, not failed
    checkpoints: int = 0
    # Ended for good (failed, or cancelled as asked) with dependents: the caller settles them.
    failed_with_dependents: tuple[str, ...] = ()
    # [id, holder, token, status, timed out] per recovered item (for the signal).
    items: tuple[list[Any], ...] = ()


class Storage(ABC):
    """One database alias's SQL and the operations that differ between databases."""

    vendor: str = ""
    # Workers on many hosts can share it (one write lock would serialize them).
    serves_many_hosts: bool = False
    # Idle workers can wait for new work on a LISTEN connection.
    can_listen: bool = False
    # One statement can complete finished items and claim new ones.
    completes_while_claiming: bool = False
    # Large batches of plain items are streamed in while they are validated.
    streams_large_batches: bool = False
    # The planner estimates a query's rows cheaply (`estimated_rows`).
    estimates_rows: bool = False
    # A JSON containment filter (`__contains`) runs, and an index answers it.
    indexes_json_containment: bool = False

    __slots__ = ("using",)

    def __init__(self, using: str = "default") -> None:
        self.using = using

    def __repr__(self) -> str:
        return f"<{type(self).__name__} using={self.using!r}>"

    # --- the database clock ------------------------------------------------------------

    @property
    @abstractmethod
    def now(self) -> str:
        """The database clock, fixed for the statement."""

    @abstractmethod
    def clock(self) -> str:
        """The database clock moved by a signed number of seconds, given as one parameter.

        Pair it with `offset(seconds)`: positive is the future, negative the past.
        """

    @abstractmethod
    def offset(self, seconds: float) -> Any:
        """The parameter of `clock()` for `seconds` (negative: before now)."""

    @abstractmethod
    def earliest(self, a: str, b: str) -> str:
        """The earlier of two timestamps (both must be set)."""

    @abstractmethod
    def seconds_between(self, later: str, earlier: str) -> str:
        """Whole seconds from `earlier` to `later`, as an integer expression."""

    @abstractmethod
    def older_than(self, column: str, seconds: str) -> str:
        """`column` is more than `seconds` (an SQL expression) before now."""

    def datetime_param(self, value: datetime | None) -> Any:
        """A datetime as this database compares it."""
        return value

    # --- values and lists ---------------------------------------------------------------

    @abstractmethod
    def json(self) -> str:
        """A placeholder for JSON text, stored as this database stores JSON."""

    @abstractmethod
    def as_text(self, column: str) -> str:
        """A JSON or text column read back as text."""

    @abstractmethod
    def json_array_text(self, *columns: str) -> str:
        """The JSON columns as one JSON array, as text."""

    @abstractmethod
    def in_list(self, column: str, values: Sequence[Any]) -> Statement:
        """`column IN (...)` for a non-empty list of values."""

    @abstractmethod
    def one_of(self, column: str, values: Sequence[str]) -> Statement:
        """`column` is one of `values` (texts), with one parameter whatever their number."""

    @abstractmethod
    def keys_table(self, alias: str, values: Sequence[str]) -> Statement:
        """A FROM item `alias(key)` with one row per text value, from one parameter."""

    @abstractmethod
    def rows_table(
        self, alias: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
    ) -> Statement:
        """A FROM item `alias(columns)` with these rows; `columns` are (name, SQL type)."""

    # --- locks ---------------------------------------------------------------------------

    @abstractmethod
    def row_lock(self, mode: str) -> str:
        """`FOR <mode>` (UPDATE, NO KEY UPDATE, SHARE) where rows are locked one by one."""

    @abstractmethod
    def skip_locked(self, mode: str = "UPDATE") -> str:
        """A row lock that concurrent lockers skip instead of waiting for."""

    @abstractmethod
    def with_address(self, columns: str) -> str:
        """`columns`, plus the row's address where a locked row is updated by it."""

    def lock_tasks(self, task_ids: Sequence[str]) -> None:  # noqa: B027 - SQLite needs none
        """Take the checkpoint locks of these tasks, in this order (inside a transaction)."""

    def lock_dependents(self, ids: Sequence[str]) -> None:  # noqa: B027 - SQLite needs none
        """Row-lock the dependents of these items, in id order (inside a transaction)."""

    def lock_period_keys(self, keys: Sequence[str]) -> None:  # noqa: B027 - SQLite needs none
        """Serialize enqueues of these period-scoped unique keys until commit."""

    # --- claims --------------------------------------------------------------------------

    @abstractmethod
    def claim_range(self, column: str, values: Sequence[str]) -> Statement:
        """An extra claim condition implied by `column IN values` that the claim index
        can use (empty where it buys nothing)."""

    @abstractmethod
    def not_paused(self, queue_key: str, type_key: str, active_keys: str) -> str:
        """Neither key is among the active pauses' keys (`active_keys`, a subquery)."""

    @abstractmethod
    def epoch(self, timestamp: str) -> str:
        """A timestamp expression as seconds since the epoch (a float)."""

    @abstractmethod
    def wall_clock(self) -> str:
        """The database clock when the expression is evaluated (not fixed for the statement)."""

    @abstractmethod
    def instant(self, epoch: float, *, with_offset: bool = False) -> str:
        """A timestamp the database clock read earlier (seconds since the epoch) as SQL;
        `with_offset`: plus one parameter's offset, as `clock()` takes it."""

    def lock_limits(self, limits: Limits) -> None:
        """Serialize this transaction's claim against other claims of its concurrency limits
        (PostgreSQL's advisory locks; SQLite's one writer needs none)."""
        return None

    def collate_c(self) -> str:
        """The collation that orders text by code point (SQLite's default)."""
        return ""

    def in_claim_order(self, statement: str) -> str:
        """A claim statement made to walk the claim index in order."""
        return statement

    def without_parallel_workers(self, statement: str) -> str:
        """A console read run by one process, whatever the planner estimates."""
        return statement

    @abstractmethod
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
        """Claim up to `n` items in claim order; returns their lease columns. With
        `fairness`, in turn order, each row followed by its fairness key and its key's
        place in the rotation (`leasing.sql.fairness`)."""

    @abstractmethod
    def first_rows_of_each(
        self,
        outer: str,
        columns: str,
        where: Statement,
        order: str,
        limit: Statement,
        flat_limit: Statement,
    ) -> Statement:
        """`outer` joined to, for each of its rows, the first `work_items` rows by `order`
        that match `where` (which may read the outer row), as `c` with `columns`' names.

        At most `limit` rows each (an expression that may read the outer row), or
        `flat_limit` (one that may not) where a subquery's LIMIT cannot see its
        outer row; a claim's candidates, so locked as `skip_locked` locks them."""

    @abstractmethod
    def run_claim(self, statement: Statement, limits: Limits) -> list[tuple[Any, ...]]:
        """Run a claim (its rows as tuples), serialized against other claims of its limits."""

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
        """Complete finished items and claim new ones in one statement
        (where `completes_while_claiming`); with `fairness`, in turn order, each claimed
        row carrying its fairness key and place in the rotation before its kind."""
        raise NotImplementedError

    @abstractmethod
    def complete(self, holder: str, done: list[tuple[str, int, str | None]]) -> set[LeaseKey]:
        """Complete held leases (id, token, output JSON); the keys it completed.

        An item something depends on is left alone (see `sql.work_items.complete_one`).
        """

    @abstractmethod
    def renew(
        self, holder: str, renewals: Sequence[Renewal]
    ) -> tuple[dict[LeaseKey, Any], set[LeaseKey]]:
        """Renew these leases: `({key: new expiry}, lost keys)`.

        A lease in neither is still held but was locked by another transaction.
        """

    def notify(self, queue_names: Iterable[str]) -> None:  # noqa: B027 - nobody listens
        """Wake idle workers of these queues (when the transaction commits)."""

    # --- the sweep -----------------------------------------------------------------------

    @abstractmethod
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
        """Recover up to `batch_size` expired leases with their checkpoints
        (inside the caller's transaction)."""

    @abstractmethod
    def trim_checkpoints(self, retention: int, since: datetime | None) -> Statement:
        """Delete each task's checkpoints beyond its newest `retention` (tasks given
        one since `since`, or all); returns the deleted ids."""

    # --- new items ----------------------------------------------------------------------

    @abstractmethod
    def insert(self, items: list[NewItem]) -> Callable[[NewItem], datetime | None]:
        """Insert plain items and wake idle workers; returns each row's creation time."""

    def stream(self, items: Iterable[NewItem]) -> datetime | None:
        """Insert plain items while they are validated (where `streams_large_batches`)."""
        raise NotImplementedError

    @abstractmethod
    def insert_rich(self, rows: list[RichRow], on_conflict: str, returning: str) -> list[Statement]:
        """Statements inserting items with unique keys or dependencies (held keys skipped)."""

    # --- the console ---------------------------------------------------------------------

    @abstractmethod
    def finished_groups(
        self, start: datetime, end: datetime | None, step: timedelta, origin: datetime
    ) -> list[dict[str, Any]]:
        """The items finished in [start, end), grouped per bucket of `step` from `origin`
        (`bucket, quarter, queue_name, work_type, status, retry_count, run_bucket, n,
        run_seconds`)."""

    def estimated_rows(self, queryset: QuerySet[Any]) -> int:
        """The planner's estimate of a queryset's rows (where `estimates_rows`)."""
        raise NotImplementedError

    def estimated_rows_many(self, querysets: Sequence[QuerySet[Any]]) -> list[int]:
        """The planner's estimate of each queryset's rows (where `estimates_rows`)."""
        return [self.estimated_rows(queryset) for queryset in querysets]

    def replication(self) -> tuple[bool, str | None, str | None, float | None, bool] | None:
        """This alias as a replica: (in recovery, replayed, received, age s, paused);
        None where the database does not replicate."""
        return None

    def wal_end(self) -> str | None:
        """The WAL end of this alias (a primary), or None."""
        return None

    def option_problems(self) -> list[str]:
        """What the alias's OPTIONS lack for concurrent workers (empty: nothing)."""
        return []

    # --- driver errors (class methods: a caller may hold only the error) ------------------

    @classmethod
    def raised(cls, error: BaseException) -> bool:
        """The error comes from this database's driver."""
        return False

    @classmethod
    def is_lock_conflict(cls, error: BaseException) -> bool:
        """The statement was aborted by a lock conflict and changed nothing."""
        return False

    @classmethod
    def is_unavailable(cls, error: BaseException) -> bool:
        """The database is unreachable, not the statement wrong."""
        return True

    @classmethod
    def breaks_unique(cls, error: BaseException, index: str, columns: str) -> bool:
        """The statement broke the unique index `index` on `columns` ("table.a, table.b")."""
        return False

    @classmethod
    def lacks_schema(cls, error: BaseException) -> bool:
        """The statement named a table or column the database does not have: leasing's
        migrations were not applied there (or a replica of another database was named)."""
        return False

    # --- running statements ---------------------------------------------------------------

    def bound_statements(self, seconds: float) -> None:  # noqa: B027 - SQLite: its busy timeout
        """Cancel this thread's later statements that run longer than `seconds`."""

    def prepare(self, cursor: Any) -> None:  # noqa: B027 - nothing to prepare by default
        """Adjust a cursor before a catalogue statement runs on it."""

    def next_result_with_rows(self, cursor: Any) -> None:  # noqa: B027
        """Move a cursor past leading result sets that return no rows."""

    def has_rows(self, cursor: Any) -> bool:
        """The cursor's current result set returns rows."""
        return cursor.description is not None

    @property
    def connection(self) -> Any:
        return connections[self.using]
