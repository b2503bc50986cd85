"""How an attempt that did not succeed ends, recorded as an `error_boundary` checkpoint.

Three endings, each one transaction: the fenced release, then the
checkpoint saying what it did (nothing is written if the lease moved on):

* `fail_attempt`: the handler raised (or its output cannot be stored): the
  item is retried after a backoff while retries are left and `retry` allows,
  else failed for good;
* `interrupt_attempt`: the database cut the attempt short (a lost
  connection, a lock timeout): the item goes back to `pending` without
  counting a retry, up to `MAX_INTERRUPTIONS` in a row, after which the
  interruption counts like a failure, so a handler that breaks its own
  connection cannot loop forever;
* `time_out_attempt`: the handler ran into its lease's deadline (its type's
  `timeout` or `MAX_LEASE_LIFETIME`): retried or failed by the type's
  `on_lease_expired` policy, with "Timed out after N s" (and "- retry n/m"
  when it goes back to pending; never for an item asked to stop, which ends
  cancelled, nor one superseded by the holder of its unique key).

The checkpoint's `error` is the message the ending stored on the row, as the
sweep's is: "Cancelled as asked; ..." or "Superseded by ..." when it says so.
"""

from __future__ import annotations

import traceback as tb
from typing import TYPE_CHECKING

from django.db import transaction

from ..exceptions import UnstorableOutput
from ..sql.snapshots import MAX_TRACEBACK_CHARS, clean_text, error_boundary
from ..states import CheckpointType, WorkItemStatus
from .checkpoints import record_checkpoint
from .held import Lease, ReleaseOutcome
from .terms import error_text

if TYPE_CHECKING:  # leases imports nothing from here; the annotation only
    from .leases import LeaseManager

MAX_INTERRUPTIONS = 5


def _record(
    manager: LeaseManager,
    lease: Lease,
    outcome: ReleaseOutcome,
    *,
    reason: str,
    error: BaseException | str,
    elapsed_ms: float | None,
) -> None:
    """Write the attempt's `error_boundary` checkpoint, saying what became of the item.

    Written after the fenced ending in the same transaction, so it states the
    outcome the row took (a retry, a failure, cancelled as asked, or
    superseded: failed because another item holds its unique key) with the
    message the row took, and nothing is written if the lease was gone.
    """
    exception_class_path = trace = None
    if isinstance(error, UnstorableOutput):
        error = error.original  # what made it unstorable is what the record names
    if isinstance(error, BaseException):
        kind = type(error)
        exception_class_path = f"{kind.__module__}.{kind.__qualname__}"
        trace = clean_text(
            "".join(tb.format_exception(error))[-MAX_TRACEBACK_CHARS:], MAX_TRACEBACK_CHARS
        )
    snapshot = error_boundary(
        error=outcome.error_message,
        reason=(
            "cancelled"
            if outcome.status == WorkItemStatus.CANCELLED
            else "superseded"
            if outcome.superseded_by
            else reason
        ),
        exception_class_path=exception_class_path,
        traceback=trace,
        worker_id=lease.worker_id,
        lease_token=lease.token,
        attempt=lease.retry_count + 1,
        retry_count=outcome.retry_count,
        max_retries=lease.max_retries,
        will_retry=outcome.will_retry,
        new_status=outcome.status,
        work_type=lease.work_type,
        elapsed_ms=None if elapsed_ms is None else round(elapsed_ms, 1),
    )
    record_checkpoint(
        lease.task_id,
        CheckpointType.ERROR_BOUNDARY,
        snapshot,
        work_item=lease.work_item_id,
        metadata={"source": "worker"},
        using=manager.using,
    )


def fail_attempt(
    manager: LeaseManager,
    lease: Lease,
    error: BaseException | str,
    *,
    retry: bool,
    reason: str = "handler_error",
    elapsed_ms: float | None = None,
    note_retry: bool = False,
) -> ReleaseOutcome:
    """End the attempt and record it; `LeaseLostError` if the lease moved on.

    `note_retry`: the stored message ends "- retry n/m" if the item goes back to
    pending, as the ending statement decides.
    """
    with transaction.atomic(using=manager.using):
        outcome = manager.end_attempt(
            lease.key,
            retry=retry,
            error=error_text(error),
            retry_count=lease.retry_count,
            note_retry=note_retry,
        )
        _record(manager, lease, outcome, reason=reason, error=error, elapsed_ms=elapsed_ms)
        return outcome


def interrupt_attempt(
    manager: LeaseManager, lease: Lease, error: BaseException, *, elapsed_ms: float | None = None
) -> ReleaseOutcome:
    """Hand the item back without counting a retry (until MAX_INTERRUPTIONS in a row)."""
    if lease.interruptions + 1 >= MAX_INTERRUPTIONS:
        text = f"{error_text(error)} ({MAX_INTERRUPTIONS} interruptions in a row)"
        return fail_attempt(
            manager, lease, text, retry=True, reason="interrupted", elapsed_ms=elapsed_ms
        )
    with transaction.atomic(using=manager.using):
        outcome = manager.requeue(lease.key, interrupted=True, error=error_text(error))
        _record(manager, lease, outcome, reason="interrupted", error=error, elapsed_ms=elapsed_ms)
        return outcome


def time_out_attempt(
    manager: LeaseManager, lease: Lease, *, retry: bool, elapsed_ms: float | None = None
) -> ReleaseOutcome:
    """End an attempt that reached its lease's deadline.

    The retry note is the ending statement's to add, from the outcome it
    writes: only an item that goes back to pending gets it, not one asked to
    stop (cancelled) nor one whose unique key another item holds (superseded),
    even when that holder commits while the statement runs (it runs again).
    """
    message = f"Timed out after {round(lease.cap_seconds)} s"
    return fail_attempt(
        manager,
        lease,
        message,
        retry=retry,
        reason="timed_out",
        elapsed_ms=elapsed_ms,
        note_retry=True,
    )
