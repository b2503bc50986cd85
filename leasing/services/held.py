"""What a lease is, and the leases a manager holds.

A lease is identified by its item and its fencing token (`Lease.key`): a new
claim of the same item, even by the same process, is a new lease, and every
structure that tracks a run is keyed by that pair.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from .. import validation
from ..exceptions import (
    InvalidInput,
    LeaseConflictError,
    LeaseExpiredError,
    LeaseLostError,
    WorkItemNotFound,
)
from ..sql import work_items as sql
from ..sql.runner import load_json, run_one, to_datetime
from ..states import WorkItemStatus
from ..storage import storage_for

LeaseKey = tuple[str, int]


class Lease(NamedTuple):
    """A claimed work item, as the claim left it.

    Immutable like the frozen dataclasses elsewhere, but a tuple: a busy
    worker builds hundreds of thousands a minute, and a frozen dataclass's
    `__init__` (one `object.__setattr__` a field) costs about ten times as much.
    Change one with `_replace`.
    """

    work_item_id: str
    task_id: str
    work_type: str
    queue_name: str
    priority: int
    input_data: Any
    token: int
    worker_id: str
    acquired_at: datetime
    expires_at: datetime
    deadline_at: datetime
    retry_count: int
    max_retries: int
    interruptions: int
    created_at: datetime
    # The enqueuer's W3C trace context when tracing was on (leasing.tracing), else None.
    trace_context: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return self.work_item_id

    @property
    def key(self) -> LeaseKey:
        """What identifies this lease (a new claim of the item is a new lease)."""
        return (self.work_item_id, self.token)

    @property
    def cap_seconds(self) -> float:
        """The most this lease can live, from its claim."""
        return (self.deadline_at - self.acquired_at).total_seconds()


@dataclass(frozen=True, slots=True)
class ReleaseOutcome:
    """What a release did: the item's new status, retry count and `run_after`."""

    work_item_id: str
    token: int
    status: str
    retry_count: int
    run_after: datetime | None
    # The item that holds its unique key: it would have gone back to pending,
    # and ended failed instead (`leasing.transitions`).
    superseded_by: str | None = None
    # The error message the ending stored on the row (None for a completion).
    error_message: str | None = None

    @property
    def will_retry(self) -> bool:
        return self.status == WorkItemStatus.PENDING


_LEASE_WIDTH = len(sql.LEASE_COLUMNS)  # a row may carry more columns after them
_TIMESTAMPS = tuple(
    sql.LEASE_COLUMNS.index(column)
    for column in ("lease_acquired_at", "lease_expires_at", "lease_deadline_at", "created_at")
)


def leased_ids(lease: Any, item_id: str | None, task_id: str | None) -> tuple[str, str]:
    """The item and task a write made under `lease` belongs to: a `work_item` or
    `task_id` the caller also gave must be the leased ones (InvalidInput otherwise)."""
    if not isinstance(lease, Lease):
        raise InvalidInput(f"lease must be a Lease, got {validation._short(lease)}.")
    if item_id is not None and item_id != lease.work_item_id:
        raise InvalidInput(f"work_item {item_id!r} is not the leased item {lease.work_item_id!r}.")
    if task_id is not None and task_id != lease.task_id:
        raise InvalidInput(f"task_id {task_id!r} is not the leased item's task {lease.task_id!r}.")
    return lease.work_item_id, lease.task_id


def leases_from_rows(rows: Sequence[Sequence[Any]], worker_id: str) -> list[Lease]:
    """Claimed rows (`sql.LEASE_COLUMNS`, in that order) as leases, in their order.

    By position, not by name: this runs once per claimed item. The rows of
    one result share their column types, so the first row tells whether the
    timestamps came aware in UTC already (PostgreSQL, through psycopg's
    loader): then no value goes through `to_datetime`, whose call for each
    of four timestamps a row cost more than the rest of the row.
    """
    if rows and not all(_in_utc(rows[0][i]) for i in _TIMESTAMPS):
        rows = [_in_utc_row(row) for row in rows]
    return [
        Lease(
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            None if r[5] is None else load_json(r[5]),
            r[6],
            worker_id,
            r[7],
            r[8],
            r[9],
            r[10],
            r[11],
            r[12],
            r[13],
            None if r[14] is None else load_json(r[14]),
        )
        for r in rows
    ]


def _in_utc_row(row: Sequence[Any]) -> list[Any]:
    """The row with its timestamps as aware UTC datetimes (text from SQLite, other zones)."""
    converted = list(row[:_LEASE_WIDTH])
    for i in _TIMESTAMPS:
        converted[i] = to_datetime(converted[i])
    return converted


def _in_utc(value: Any) -> bool:
    return isinstance(value, datetime) and value.tzinfo is UTC


def outcome_from_row(row: dict[str, Any]) -> ReleaseOutcome:
    return ReleaseOutcome(
        work_item_id=row["work_item_id"],
        token=row["lease_token"],
        status=row["status"],
        retry_count=row["retry_count"],
        run_after=to_datetime(row["run_after"]),
        superseded_by=row.get("superseded_by"),
        error_message=row.get("error_message"),
    )


class HeldLeases:
    """The leases one manager claimed and has not released or lost (thread-safe)."""

    def __init__(self) -> None:
        self._leases: dict[LeaseKey, Lease] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._leases)

    def all(self) -> list[Lease]:
        with self._lock:
            return list(self._leases.values())

    def get(self, key: LeaseKey) -> Lease | None:
        with self._lock:
            return self._leases.get(key)

    def newest(self, work_item_id: str) -> Lease | None:
        """The newest held lease on an item (callers that name no token mean this one)."""
        with self._lock:
            leases = [lease for key, lease in self._leases.items() if key[0] == work_item_id]
        return max(leases, key=lambda lease: lease.token, default=None)

    def add(self, leases: Iterable[Lease]) -> None:
        with self._lock:
            for lease in leases:
                self._leases[lease.key] = lease

    def discard(self, keys: Iterable[LeaseKey]) -> None:
        with self._lock:
            for key in keys:
                self._leases.pop(key, None)

    def set_expiries(self, expiries: dict[LeaseKey, datetime | None]) -> None:
        with self._lock:
            for key, expires_at in expiries.items():
                lease = self._leases.get(key)
                if lease is not None and expires_at is not None:
                    self._leases[key] = lease._replace(expires_at=expires_at)


def refusal(
    using: str, worker_id: str, work_item_id: str, token: int | None, *, renewing: bool
) -> Exception:
    """The specific error for a fenced write by `worker_id` that matched no row."""
    row = run_one(using, sql.lease_state(storage_for(using), work_item_id))
    if row is None:
        return WorkItemNotFound(work_item_id)
    status, holder, current = row["status"], row["lease_holder"], row["lease_token"]
    if token is None:
        return LeaseConflictError(
            f"Worker {worker_id!r} holds no lease on work item {work_item_id!r} "
            f"(status {status}, holder {holder!r})."
        )
    mine = holder == worker_id and current == token
    if status == WorkItemStatus.IN_PROGRESS and mine and not row["live"]:
        error: type[Exception] = LeaseExpiredError if renewing else LeaseLostError
        why = "reached its deadline" if row["past_deadline"] else "has expired"
        return error(
            f"The lease of worker {worker_id!r} on work item {work_item_id!r} "
            f"(token {token}) {why}."
        )
    if status == WorkItemStatus.IN_PROGRESS and not mine:
        error = LeaseConflictError if renewing else LeaseLostError
        return error(
            f"Work item {work_item_id!r} is held by {holder!r} with token {current}; "
            f"worker {worker_id!r} had token {token}."
        )
    return LeaseLostError(
        f"Worker {worker_id!r} no longer holds work item {work_item_id!r} "
        f"(token {token}): it is now {status}"
        + (f" with token {current}" if current != token else "")
        + "."
    )
