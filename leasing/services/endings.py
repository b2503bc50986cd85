"""How an attempt that did not succeed ends, recorded as an `error_boundary` checkpoint.

Three endings, each one transaction (checkpoint and release together, both
fenced by the lease):

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
  `on_lease_expired` policy, with "Timed out after N s".
"""

from __future__ import annotations

import traceback as tb
from typing import TYPE_CHECKING

from django.db import transaction

from ..sql.snapshots import MAX_TRACEBACK_CHARS, clean_text, error_boundary
from ..states import CheckpointType, WorkItemStatus
from .checkpoints import create_checkpoint
from .held import Lease, ReleaseOutcome
from .terms import error_text

if TYPE_CHECKING:  # leases imports nothing from here; the annotation only
    from .leases import LeaseManager

MAX_INTERRUPTIONS = 5


def _record(
    manager: LeaseManager,
    lease: Lease,
    message: str | None,
    *,
    reason: str,
    will_retry: bool,
    counts_retry: bool,
    error: BaseException | str,
    elapsed_ms: float | None,
) -> None:
    """Write the attempt's `error_boundary` checkpoint, fenced by its lease."""
    exception_class_path = trace = None
    if isinstance(error, BaseException):
        kind = type(error)
        exception_class_path = f"{kind.__module__}.{kind.__qualname__}"
        trace = clean_text(
            "".join(tb.format_exception(error))[-MAX_TRACEBACK_CHARS:], MAX_TRACEBACK_CHARS
        )
    snapshot = error_boundary(
        error=message,
        reason=reason,
        exception_class_path=exception_class_path,
        traceback=trace,
        worker_id=lease.worker_id,
        lease_token=lease.token,
        attempt=lease.retry_count + 1,
        retry_count=lease.retry_count + (1 if will_retry and counts_retry else 0),
        max_retries=lease.max_retries,
        will_retry=will_retry,
        new_status=WorkItemStatus.PENDING.value if will_retry else WorkItemStatus.FAILED.value,
        work_type=lease.work_type,
        elapsed_ms=None if elapsed_ms is None else round(elapsed_ms, 1),
    )
    create_checkpoint(
        lease.task_id,
        CheckpointType.ERROR_BOUNDARY,
        snapshot,
        metadata={"source": "worker"},
        lease=lease,
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
) -> ReleaseOutcome:
    """Record the failure and end the attempt; `LeaseLostError` if the lease moved on."""
    message = error_text(error)
    will_retry = retry and lease.retry_count < lease.max_retries
    with transaction.atomic(using=manager.using):
        _record(
            manager,
            lease,
            message,
            reason=reason,
            will_retry=will_retry,
            counts_retry=True,
            error=error,
            elapsed_ms=elapsed_ms,
        )
        return manager.end_attempt(
            lease.key, retry=retry, error=message, retry_count=lease.retry_count
        )


def interrupt_attempt(
    manager: LeaseManager, lease: Lease, error: BaseException, *, elapsed_ms: float | None = None
) -> ReleaseOutcome:
    """Hand the item back without counting a retry (until MAX_INTERRUPTIONS in a row)."""
    if lease.interruptions + 1 >= MAX_INTERRUPTIONS:
        text = f"{error_text(error)} ({MAX_INTERRUPTIONS} interruptions in a row)"
        return fail_attempt(
            manager, lease, text, retry=True, reason="interrupted", elapsed_ms=elapsed_ms
        )
    message = error_text(error)
    with transaction.atomic(using=manager.using):
        _record(
            manager,
            lease,
            message,
            reason="interrupted",
            will_retry=True,
            counts_retry=False,
            error=error,
            elapsed_ms=elapsed_ms,
        )
        return manager.requeue(lease.key, interrupted=True, error=message)


def time_out_attempt(
    manager: LeaseManager, lease: Lease, *, retry: bool, elapsed_ms: float | None = None
) -> ReleaseOutcome:
    """End an attempt that reached its lease's deadline."""
    message = f"Timed out after {round(lease.cap_seconds)} s"
    if retry and lease.retry_count < lease.max_retries:
        message += f" - retry {lease.retry_count + 1}/{lease.max_retries}"
    return fail_attempt(
        manager, lease, message, retry=retry, reason="timed_out", elapsed_ms=elapsed_ms
    )
