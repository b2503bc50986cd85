"""Writing how each run ended, whatever the database does meanwhile.

A run ends completed (batched by the dispatcher), failed, interrupted by the
database, timed out, or handed back. Each ending is a fenced write: if the
lease moved on, the write changes nothing and the run is counted as lost.
An ending that meets a lost connection or a lock timeout is written again
until it succeeds, the lease is surely gone (its expiry passed: the sweep owns
the item now) or the worker is told to exit at once. Infrastructure trouble
therefore never costs an item an attempt and never fails it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from django.db import DatabaseError

from ..exceptions import (
    DatabaseUnavailable,
    InvalidInput,
    LeaseConflictError,
    LeaseExpiredError,
    PermanentError,
    WorkItemNotFound,
    one_line,
)
from ..services import endings
from ..services.held import ReleaseOutcome
from ..services.leases import LeaseManager
from ..sql.runner import close_connection, is_infrastructure_error
from ..states import WorkItemStatus
from .slots import Slot

logger = logging.getLogger("leasing.worker")
T = TypeVar("T")

# How long an ending keeps trying after the database failed it, at most per pause.
RETRY_PAUSE_MAX = 2.0


@dataclass(slots=True)
class Counters:
    """What a worker did; thread-safe through `lock`."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    interrupted: int = 0
    timed_out: int = 0
    lost: int = 0
    requeued: int = 0
    cancelled: int = 0
    # Not yet added to the process's `workers` row.
    unreported_completed: int = 0
    unreported_failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def summary(self, worker_id: str, elapsed_seconds: float, reason: str) -> WorkerSummary:
        with self.lock:
            counts = {
                name: getattr(self, name)
                for name in WorkerSummary.__dataclass_fields__
                if name not in ("worker_id", "elapsed_seconds", "reason")
            }
        return WorkerSummary(
            worker_id=worker_id, elapsed_seconds=elapsed_seconds, reason=reason, **counts
        )

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)
            self.unreported_completed += counts.get("completed", 0)
            self.unreported_failed += counts.get("failed", 0)


@dataclass(frozen=True, slots=True)
class WorkerSummary:
    """What a worker did, from its start until now (or until it stopped, and why)."""

    worker_id: str
    claimed: int
    completed: int
    failed: int
    retried: int
    interrupted: int
    timed_out: int
    lost: int
    requeued: int
    cancelled: int
    elapsed_seconds: float
    reason: str


def classify(exc: BaseException) -> str:
    """How a handler's exception ends its run: interrupted, permanent or retry.

    Any exception a handler raises is a handler failure, `SystemExit`,
    `KeyboardInterrupt` and `GeneratorExit` included (a real signal reaches
    the main thread, never a handler). An error caused by the database going
    away, anywhere in the exception's chain, is an interruption.
    """
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            break
        if is_infrastructure_error(seen):
            return "interrupted"
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, PermanentError | InvalidInput):
        return "permanent"
    return "retry"


class Recorder:
    """Writes endings for one worker, retrying what the database interrupts."""

    def __init__(
        self, manager: LeaseManager, counters: Counters, exiting: Callable[[], bool]
    ) -> None:
        self.manager = manager
        self.counters = counters
        self.exiting = exiting

    def write(self, slot: Slot, what: str, write: Callable[[], T]) -> T | None:
        """Run `write` until it lands; None when the lease or its item is gone, or the
        worker exits."""
        failures = 0
        while True:
            try:
                return write()
            except (LeaseExpiredError, LeaseConflictError) as lost:
                logger.warning(
                    "lease on %s (token %d) was gone before %s could be written (%s); "
                    "the sweep or its new holder decides what happens next",
                    slot.lease.work_item_id,
                    slot.lease.token,
                    what,
                    lost,
                )
                self.counters.add(lost=1)
                return None
            except WorkItemNotFound:
                # Deleted by an operator while its handler ran: a lost lease whose item
                # nobody decides about any more.
                logger.warning(
                    "abandoned the run of %s (token %d): its item no longer exists, so %s "
                    "was not written",
                    slot.lease.work_item_id,
                    slot.lease.token,
                    what,
                )
                self.counters.add(lost=1)
                return None
            except (DatabaseUnavailable, DatabaseError) as exc:
                if not is_infrastructure_error(exc):
                    logger.exception("writing %s of %s failed", what, slot.lease.work_item_id)
                    return None
                failures += 1
                close_connection(self.manager.using)
                if self.exiting() or slot.lease_surely_expired():
                    logger.warning(
                        "could not write %s of %s (%s); its lease runs out and the sweep "
                        "takes it over",
                        what,
                        slot.lease.work_item_id,
                        one_line(exc),
                    )
                    return None
                if failures == 1 or failures % 10 == 0:
                    logger.warning(
                        "writing %s of %s failed (%s); trying again",
                        what,
                        slot.lease.work_item_id,
                        one_line(exc),
                    )
                time.sleep(min(0.05 * 2 ** min(failures, 6), RETRY_PAUSE_MAX))

    def failure(
        self, slot: Slot, exc: BaseException, kind: str | None = None
    ) -> ReleaseOutcome | None:
        """Record a handler's exception as its run's ending (`kind`: as `classify` put it
        where it was raised, for an exception from a child process)."""
        kind = kind or classify(exc)
        lease = slot.lease
        elapsed = slot.elapsed_ms()
        if kind == "interrupted":
            close_connection(self.manager.using)  # it may be the broken one
            outcome = self.write(
                slot,
                "an interruption",
                lambda: endings.interrupt_attempt(self.manager, lease, exc, elapsed_ms=elapsed),
            )
        else:
            outcome = self.write(
                slot,
                "a failure",
                lambda: endings.fail_attempt(
                    self.manager, lease, exc, retry=kind == "retry", elapsed_ms=elapsed
                ),
            )
        if outcome is not None:
            self.log_ending(slot, outcome, one_line(exc), interrupted=kind == "interrupted")
        return outcome

    def time_out(self, slot: Slot) -> ReleaseOutcome | None:
        lease = slot.lease
        outcome = self.write(
            slot,
            "a time-out",
            lambda: endings.time_out_attempt(
                self.manager,
                lease,
                retry=slot.spec.on_lease_expired == "retry",
                elapsed_ms=slot.elapsed_ms(),
            ),
        )
        if outcome is not None:
            self.counters.add(timed_out=1)
            self.log_ending(slot, outcome, f"timed out after {round(lease.cap_seconds)} s")
        return outcome

    def hand_back(self, slot: Slot, why: str) -> ReleaseOutcome | None:
        outcome = self.write(
            slot, "a hand-back", lambda: self.manager.requeue(slot.key, interrupted=False)
        )
        if outcome is not None and outcome.status == WorkItemStatus.CANCELLED:
            logger.info(
                "%s (%s) not handed back (%s): cancelled, as asked",
                slot.lease.work_item_id,
                slot.lease.work_type,
                why,
            )
            self.counters.add(cancelled=1)
        elif outcome is not None and outcome.superseded_by:
            logger.info(
                "%s (%s) not handed back (%s): superseded by %s, which holds its unique key",
                slot.lease.work_item_id,
                slot.lease.work_type,
                why,
                outcome.superseded_by,
            )
            self.counters.add(failed=1)
        elif outcome is not None:
            logger.info(
                "handed back %s (%s): %s", slot.lease.work_item_id, slot.lease.work_type, why
            )
            self.counters.add(requeued=1)
        return outcome

    def log_ending(
        self, slot: Slot, outcome: ReleaseOutcome, error: str, *, interrupted: bool = False
    ) -> None:
        lease = slot.lease
        if interrupted and outcome.will_retry and outcome.retry_count == lease.retry_count:
            logger.warning(
                "interrupted %s (%s) after %d ms by the database (%s); handed back, "
                "not counted as a retry",
                lease.work_item_id,
                lease.work_type,
                slot.elapsed_ms(),
                error,
            )
            self.counters.add(interrupted=1)
        elif outcome.status == WorkItemStatus.CANCELLED:
            logger.info(
                "cancelled %s (%s) after %d ms, as asked (%s)",
                lease.work_item_id,
                lease.work_type,
                slot.elapsed_ms(),
                error,
            )
            self.counters.add(cancelled=1)
        elif outcome.superseded_by:
            logger.info(
                "%s (%s) failed after %d ms with %s and is not retried: superseded by %s, "
                "which holds its unique key",
                lease.work_item_id,
                lease.work_type,
                slot.elapsed_ms(),
                error,
                outcome.superseded_by,
            )
            self.counters.add(failed=1)
        elif outcome.will_retry:
            logger.info(
                "retry scheduled for %s (%s) after %d ms: attempt %d/%d failed with %s",
                lease.work_item_id,
                lease.work_type,
                slot.elapsed_ms(),
                lease.retry_count + 1,
                lease.max_retries + 1,
                error,
            )
            self.counters.add(retried=1)
        else:
            logger.error(
                "failed %s (%s) after %d ms: %s",
                lease.work_item_id,
                lease.work_type,
                slot.elapsed_ms(),
                error,
            )
            self.counters.add(failed=1)


__all__ = ["Counters", "Recorder", "WorkerSummary", "classify", "one_line"]
