"""The worker runtime: claim, heartbeat, run the handler, release (SPEC §11.2).

One worker process has:

* a dispatcher (the thread that calls `run()`): claims batches of items with
  `acquire_leases`, hands them to the executors, and completes finished items
  in batches with one fenced statement;
* `concurrency` executor threads running handlers, each with its own database
  connection (Django gives every thread its own);
* one `LeaseRenewer` thread renewing all `thread`-mode leases of the process in
  one statement per interval and refreshing the process's `workers` row;
* on PostgreSQL, a listener thread woken by NOTIFY on enqueue, so idle workers
  start new work at once; polling (with jitter) stays as the fallback.

Shutdown (SIGTERM/SIGINT): stop claiming, give running items up to the
shutdown timeout to finish, then hand back what is left (`pending`, not counted
as a retry), mark the `workers` row `stopped` and return. A second signal
exits at once. A dropped database connection is logged, the connection is
re-opened and the worker carries on.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import signal
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models.functions import Now

from . import registry as worker_registry
from . import validation
from .checkpoints import create_checkpoint
from .conf import get_settings
from .db import is_transient_conflict
from .enqueue import NOTIFY_CHANNEL
from .exceptions import (
    DatabaseUnavailable,
    InvalidInput,
    LeaseConflictError,
    LeaseExpiredError,
    PermanentError,
    UnknownWorkType,
)
from .handlers import HandlerRegistry, HandlerSpec, WorkContext
from .handlers import registry as handler_registry
from .heartbeat import Heartbeat, LeaseExtender, LeaseExtenderConfig, LeaseRenewer
from .lease import Lease, LeaseManager
from .models import CheckpointType, WorkerRole, WorkerStatus, WorkItem

logger = logging.getLogger(__name__)

# Handlers faster than this on average let the dispatcher claim ahead.
FAST_HANDLER_SECONDS = 0.05
PREFETCH_AHEAD_SECONDS = 0.1
MAX_PREFETCH = 256


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs. `None` means "the LEASING setting"."""

    concurrency: int = 1
    work_types: tuple[str, ...] = ()  # empty: every type with a handler
    task_id: str | None = None
    queues: tuple[str, ...] = ()  # empty: every queue
    lease_seconds: float | None = None
    heartbeat_interval: float | None = None
    poll_interval: float | None = None
    max_items: int | None = None
    burst: bool = False
    worker_id: str | None = None
    shutdown_timeout: float | None = None
    # Claimed-but-unstarted items beyond `concurrency`. None: adaptive — claim
    # ahead only while handlers are fast, so slow work is never hoarded.
    prefetch: int | None = None
    summary_interval: float = 60.0
    listen: bool = True
    using: str = "default"


@dataclass(frozen=True, slots=True)
class WorkerSummary:
    worker_id: str
    claimed: int
    completed: int
    failed: int
    retried: int
    lost: int
    requeued: int
    elapsed_seconds: float
    reason: str


@dataclass(slots=True)
class _Slot:
    """One claimed item, from claim until its release is committed."""

    lease: Lease
    spec: HandlerSpec
    lease_duration: float
    heartbeat: Heartbeat = field(default_factory=Heartbeat)
    context: WorkContext | None = None
    started: bool = False
    finished: bool = False


class Worker:
    """A worker process's runtime. `run()` blocks until the worker stops."""

    def __init__(
        self, options: WorkerOptions | None = None, *, handlers: HandlerRegistry | None = None
    ) -> None:
        self.options = options = options or WorkerOptions()
        self.handlers = handlers or handler_registry
        conf = get_settings()
        self.using = options.using
        self.concurrency = validation.integer(
            "concurrency", options.concurrency, minimum=1, maximum=1000
        )
        self.prefetch = (
            None
            if options.prefetch is None
            else validation.integer("prefetch", options.prefetch, minimum=0, maximum=1000)
        )
        self._avg_run_seconds: float | None = None
        self.default_lease = validation.positive_seconds(
            "lease_seconds",
            conf.lease_duration if options.lease_seconds is None else options.lease_seconds,
        )
        self.default_interval = validation.positive_seconds(
            "heartbeat_interval",
            conf.heartbeat_interval
            if options.heartbeat_interval is None
            else options.heartbeat_interval,
        )
        self.poll_interval = validation.positive_seconds(
            "poll_interval",
            conf.poll_interval if options.poll_interval is None else options.poll_interval,
        )
        self.shutdown_timeout = validation.positive_seconds(
            "shutdown_timeout",
            conf.shutdown_timeout if options.shutdown_timeout is None else options.shutdown_timeout,
        )
        self.summary_interval = validation.positive_seconds(
            "summary_interval", options.summary_interval
        )
        self.max_items = (
            None
            if options.max_items is None
            else validation.integer("max_items", options.max_items, minimum=1)
        )
        self.task_id = (
            None
            if options.task_id is None
            else validation.non_empty_text("task_id", options.task_id)
        )
        self.queues = tuple(validation.non_empty_text("queue", q) for q in options.queues)
        self.specs = self._resolve_specs(options.work_types)
        self.work_type_filter = sorted(self.specs)
        # Handlers with their own lease duration: applied inside the one claim
        # statement, so serving many types never costs more round trips.
        self.lease_durations = {
            spec.work_type: self._lease_for(spec)
            for spec in self.specs.values()
            if self._lease_for(spec) != self.default_lease
        }
        self.renew_interval = min(self._interval_for(spec) for spec in self.specs.values())
        self.worker_id = (
            validation.non_empty_text("worker_id", options.worker_id)
            if options.worker_id
            else worker_registry.new_worker_id()
        )
        self.manager = LeaseManager(self.worker_id, using=self.using)

        self._slots: dict[str, _Slot] = {}
        self._slots_lock = threading.Lock()
        self._work: queue.SimpleQueue[_Slot | None] = queue.SimpleQueue()
        self._finished: list[tuple[_Slot, str | None, float]] = []
        self._finished_lock = threading.Lock()
        self._wake = threading.Event()
        self._notified = threading.Event()
        self._stop = threading.Event()
        self._signals = 0
        self._executors: list[threading.Thread] = []
        self._renewer: LeaseRenewer | None = None
        self._listener: threading.Thread | None = None
        self._counts = {
            "claimed": 0,
            "completed": 0,
            "failed": 0,
            "retried": 0,
            "lost": 0,
            "requeued": 0,
        }
        self._unreported = {"completed": 0, "failed": 0}
        self._counts_lock = threading.Lock()
        self._started_at = time.monotonic()
        self._previous_handlers: dict[int, Any] = {}

    # --- configuration ---------------------------------------------------------------

    def _resolve_specs(self, work_types: Sequence[str]) -> dict[str, HandlerSpec]:
        if work_types:
            specs = {}
            for work_type in work_types:
                try:
                    specs[work_type] = self.handlers.get(work_type)
                except UnknownWorkType as exc:
                    raise UnknownWorkType(str(exc)) from None
        else:
            specs = {spec.work_type: spec for spec in self.handlers.specs()}
        if not specs:
            raise UnknownWorkType(
                "No handlers are registered, so this worker could run nothing. Register one with "
                "@leasing.handlers.handler in an app's handlers.py or in LEASING['HANDLERS']."
            )
        for spec in specs.values():
            validation.heartbeat_below_lease(self._interval_for(spec), self._lease_for(spec))
        return specs

    def _lease_for(self, spec: HandlerSpec) -> float:
        return spec.lease_duration or self.default_lease

    def _interval_for(self, spec: HandlerSpec) -> float:
        return spec.heartbeat_interval or self.default_interval

    # --- signals -----------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop the worker gracefully; a second one exits at once.

        Only the main thread can own signals; a worker embedded in another
        thread is stopped with `stop()` instead.
        """
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not in the main thread: signal handlers not installed")
            return
        self._previous_handlers = {
            signum: signal.signal(signum, self._on_signal)
            for signum in (signal.SIGTERM, signal.SIGINT)
        }

    def restore_signal_handlers(self) -> None:
        for signum, previous in self._previous_handlers.items():
            signal.signal(signum, previous)
        self._previous_handlers = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            logger.warning("second signal (%s): exiting at once", signal.Signals(signum).name)
            os._exit(1)
        logger.info(
            "%s received: no new claims; finishing running items (up to %gs)",
            signal.Signals(signum).name,
            self.shutdown_timeout,
        )
        self.stop()

    def stop(self) -> None:
        """Ask the worker to stop claiming and shut down gracefully."""
        self._stop.set()
        self._wake.set()

    # --- main loop -----------------------------------------------------------------------

    def run(self) -> WorkerSummary:
        self._register()
        logger.info(
            "worker %s started: concurrency %d, work types %s, queues %s, lease %gs, heartbeat %gs",
            self.worker_id,
            self.concurrency,
            ", ".join(sorted(self.specs)),
            ", ".join(self.queues) or "all",
            self.default_lease,
            self.renew_interval,
        )
        self._start_threads()
        reason = "stopped"
        try:
            reason = self._dispatch()
        finally:
            self._shutdown()
        summary = self.summary(reason)
        logger.info(
            "worker %s stopped (%s): claimed %d, completed %d, failed %d, retried %d, "
            "lost %d, requeued %d",
            self.worker_id,
            reason,
            summary.claimed,
            summary.completed,
            summary.failed,
            summary.retried,
            summary.lost,
            summary.requeued,
        )
        return summary

    def summary(self, reason: str = "running") -> WorkerSummary:
        with self._counts_lock:
            counts = dict(self._counts)
        return WorkerSummary(
            worker_id=self.worker_id,
            elapsed_seconds=time.monotonic() - self._started_at,
            reason=reason,
            **counts,
        )

    def _register(self) -> None:
        self._with_reconnect(
            lambda: worker_registry.register(
                self.worker_id,
                WorkerRole.WORKER,
                concurrency=self.concurrency,
                work_types=sorted(self.specs),
                queues=self.queues,
                using=self.using,
            ),
            what="registering the worker",
        )

    def _start_threads(self) -> None:
        for index in range(self.concurrency):
            thread = threading.Thread(
                target=self._executor_loop, name=f"executor-{index}", daemon=True
            )
            thread.start()
            self._executors.append(thread)
        self._renewer = LeaseRenewer(
            self.manager,
            interval_seconds=self.renew_interval,
            tracked=self._renewable,
            on_lease_lost=self._on_lease_lost,
            on_tick=self._report_progress,
            max_failures=get_settings().heartbeat_max_failures,
        ).start()
        if self.options.listen and connections[self.using].vendor == "postgresql":
            self._listener = threading.Thread(
                target=self._listen, name="notify-listener", daemon=True
            )
            self._listener.start()

    def _dispatch(self) -> str:
        last_summary = time.monotonic()
        failures = conflicts = 0
        while not self._stop.is_set():
            try:
                claimed = self._cycle()
            except DatabaseUnavailable as exc:
                failures += 1
                delay = min(0.2 * 2 ** min(failures - 1, 5), 5.0)
                logger.warning(
                    "database unavailable (%s); reconnecting in %.1fs", _one_line(exc), delay
                )
                _close_connection(self.using)
                self._stop.wait(delay)
                continue
            except DatabaseError as exc:
                # PostgreSQL's SKIP LOCKED still waits for, and keeps a lock on,
                # a newer version of a row a concurrent claim just updated, so
                # claims and completions of busy workers can (rarely) deadlock.
                # The aborted statement changed nothing (its finished items
                # were put back, its claims rolled back): run it again.
                if not is_transient_conflict(exc):
                    raise
                conflicts += 1
                logger.warning(
                    "claim/complete statement aborted (%s); retrying (%d so far)",
                    _one_line(exc),
                    conflicts,
                )
                self._stop.wait(random.uniform(0.001, 0.02))
                continue
            if failures:
                logger.info("database connection restored after %d failed attempt(s)", failures)
                failures = 0
            if time.monotonic() - last_summary >= self.summary_interval:
                last_summary = time.monotonic()
                self._log_summary()
            if claimed:
                continue
            in_flight = self._in_flight()
            if not in_flight:
                if self._max_items_reached():
                    return "max-items"
                if self.options.burst:
                    if not self._due_soon():
                        return "burst-done"
                    self._wait(min(self.poll_interval, 0.05))
                    continue
                # Idle: let Django drop an obsolete or broken connection.
                connections[self.using].close_if_unusable_or_obsolete()
            self._wait_for_work(self.poll_interval * random.uniform(0.8, 1.2))
        return "signal" if self._signals else "stopped"

    def _max_items_reached(self) -> bool:
        return self.max_items is not None and self._counts["claimed"] >= self.max_items

    def _due_soon(self) -> bool:
        """Burst mode: is a retry of ours due within one poll interval?"""
        due = (
            WorkItem.objects.using(self.using)
            .pending()
            .filter(
                work_type__in=list(self.specs),
                run_after__lte=Now() + timedelta(seconds=self.poll_interval),
            )
        )
        if self.queues:
            due = due.filter(queue_name__in=self.queues)
        if self.task_id is not None:
            due = due.filter(task_id=self.task_id)
        return due.exists()

    def _wait(self, timeout: float) -> None:
        self._wake.wait(timeout)
        self._wake.clear()

    def _wait_for_work(self, timeout: float) -> None:
        """Sleep until there is something worth a round trip, or `timeout` passes.

        Worth it: a NOTIFY arrived, or finished items are waiting and either
        the executors are about to run dry or a full batch has piled up.
        Waiting for that (instead of acting on every finished item) is what
        lets one statement complete and claim many items at once.
        """
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            if self._notified.is_set():
                self._notified.clear()
                return
            with self._finished_lock:
                finished = len(self._finished)
            if finished and (
                self._work.qsize() < self.concurrency or finished >= max(1, self._prefetch_now())
            ):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wait(remaining)

    def _in_flight(self) -> int:
        with self._slots_lock:
            return len(self._slots)

    def _prefetch_now(self) -> int:
        if self.prefetch is not None:
            return self.prefetch
        average = self._avg_run_seconds
        if average is not None and average < FAST_HANDLER_SECONDS:
            # Fast handlers: claim about PREFETCH_AHEAD_SECONDS of work ahead,
            # which keeps the executors busy while the dispatcher round-trips
            # and makes each round trip a batch, but never hoards slow work.
            ahead = int(PREFETCH_AHEAD_SECONDS / max(average, 1e-4))
            return min(MAX_PREFETCH, max(4 * self.concurrency, ahead))
        return 0

    def _record_duration(self, seconds: float) -> None:
        average = self._avg_run_seconds
        self._avg_run_seconds = seconds if average is None else 0.8 * average + 0.2 * seconds

    def _cycle(self) -> int:
        """Complete what finished and claim what fits, in one round trip when possible."""
        with self._finished_lock:
            batch, self._finished = self._finished, []
        results = [(slot.lease.work_item_id, output) for slot, output, _ in batch]
        capacity = self.concurrency + self._prefetch_now() - (self._in_flight() - len(batch))
        if self.max_items is not None:
            capacity = min(capacity, self.max_items - self._counts["claimed"])
        try:
            if capacity > 0:
                completed, lost, leases = self.manager.complete_and_acquire(
                    results,
                    capacity,
                    self.default_lease,
                    work_type_filter=self.work_type_filter,
                    task_id_filter=self.task_id,
                    queue_filter=list(self.queues) or None,
                    lease_durations=self.lease_durations,
                )
            else:
                completed, lost = self.manager.complete_many(results)
                leases = []
        except BaseException:
            with self._finished_lock:
                self._finished[:0] = batch  # completed after reconnecting
            raise
        self._finish_batch(batch, completed, lost)
        return self._dispatch_leases(leases)

    def _dispatch_leases(self, leases: list[Lease]) -> int:
        for lease in leases:
            spec = self.specs[lease.work_type]
            slot = _Slot(lease, spec, self._lease_for(spec))
            with self._slots_lock:
                self._slots[lease.work_item_id] = slot
            logger.debug(
                "claimed %s (%s, token %d, attempt %d/%d)",
                lease.work_item_id,
                lease.work_type,
                lease.token,
                lease.retry_count + 1,
                lease.max_retries + 1,
            )
            self._work.put(slot)
        if leases:
            with self._counts_lock:
                self._counts["claimed"] += len(leases)
        return len(leases)

    def _flush(self) -> None:
        """Complete finished items in one fenced statement (no claims)."""
        with self._finished_lock:
            batch, self._finished = self._finished, []
        if not batch:
            return
        try:
            completed, lost = self.manager.complete_many(
                [(slot.lease.work_item_id, output) for slot, output, _ in batch]
            )
        except BaseException:
            with self._finished_lock:
                self._finished[:0] = batch  # retried after reconnecting
            raise
        self._finish_batch(batch, completed, lost)

    def _finish_batch(
        self,
        batch: list[tuple[_Slot, str | None, float]],
        completed: list[str],
        lost: list[str],
    ) -> None:
        done = set(completed)
        for slot, _output, elapsed_ms in batch:
            item_id = slot.lease.work_item_id
            if item_id in done:
                logger.info("done %s (%s) in %d ms", item_id, slot.lease.work_type, elapsed_ms)
            else:
                logger.warning(
                    "lease on %s (%s) was lost before completion; result discarded "
                    "(another worker or the sweep owns it now)",
                    item_id,
                    slot.lease.work_type,
                )
            self._release_slot(item_id)
        with self._counts_lock:
            self._counts["completed"] += len(completed)
            self._unreported["completed"] += len(completed)
            self._counts["lost"] += len(lost)

    def _release_slot(self, item_id: str) -> None:
        with self._slots_lock:
            self._slots.pop(item_id, None)
        self._wake.set()

    # --- executors -----------------------------------------------------------------------

    def _executor_loop(self) -> None:
        try:
            while True:
                slot = self._work.get()
                if slot is None:
                    return
                with self._slots_lock:
                    still_held = slot.lease.work_item_id in self._slots
                if not still_held:
                    continue  # its lease was lost while it waited
                if self._stop.is_set():
                    # Shutting down: hand unstarted work back at once.
                    self._requeue(slot, "worker stopping before it started")
                    continue
                self._execute(slot)
        finally:
            _close_connection(self.using)

    def _execute(self, slot: _Slot) -> None:
        lease, spec = slot.lease, slot.spec
        connection = connections[self.using]
        if connection.errors_occurred:
            # Only after a failure: the check resets Django's health-check flag,
            # which would cost every database-using handler a `SELECT 1`.
            connection.close_if_unusable_or_obsolete()
        context = WorkContext(lease, slot.heartbeat, using=self.using)
        slot.context = context
        slot.started = True
        started = time.monotonic()
        try:
            if spec.heartbeat == "beat":
                extender = LeaseExtender(
                    LeaseExtenderConfig(
                        interval=min(get_settings().extender_interval, self._interval_for(spec)),
                        extension=slot.lease_duration,
                    ),
                    using=self.using,
                    on_lease_lost=lambda _id, exc: context.mark_lease_lost(str(exc)),
                )
                with extender.attach(lease, slot.heartbeat):
                    output = spec.func(context)
            else:
                output = spec.func(context)
            output_json = validation.payload("handler output", output)
        except PermanentError as exc:
            self._fail(slot, exc, retry=False, started=started)
            return
        except InvalidInput as exc:
            # An unstorable result fails the same way on every attempt.
            self._fail(slot, exc, retry=False, started=started)
            return
        except Exception as exc:
            self._fail(slot, exc, retry=True, started=started)
            return
        except BaseException as exc:  # SystemExit/KeyboardInterrupt inside a handler
            self._fail(slot, exc, retry=True, started=started)
            raise
        slot.finished = True
        elapsed = time.monotonic() - started
        self._record_duration(elapsed)
        with self._finished_lock:
            self._finished.append((slot, output_json, elapsed * 1000))
        self._wake.set()

    def _fail(self, slot: _Slot, exc: BaseException, *, retry: bool, started: float) -> None:
        """Record the error as an error_boundary checkpoint and release, in one transaction."""
        slot.finished = True
        lease = slot.lease
        elapsed_ms = (time.monotonic() - started) * 1000
        will_retry = retry and lease.retry_count < lease.max_retries
        error_type = type(exc)
        snapshot = {
            "error": f"{error_type.__name__}: {exc}"[:10_000],
            "exception_class_path": f"{error_type.__module__}.{error_type.__qualname__}",
            "traceback": "".join(traceback.format_exception(exc))[-20_000:],
            "worker_id": self.worker_id,
            "lease_token": lease.token,
            "attempt": lease.retry_count + 1,
            "retry_count": lease.retry_count,
            "max_retries": lease.max_retries,
            "will_retry": will_retry,
            "permanent": not retry,
            "elapsed_ms": round(elapsed_ms, 1),
        }
        outcome = None
        for attempt in range(3):
            try:
                with transaction.atomic(using=self.using):
                    create_checkpoint(
                        lease.task_id,
                        CheckpointType.ERROR_BOUNDARY,
                        snapshot,
                        metadata={"source": "worker"},
                        lease=lease,
                        using=self.using,
                    )
                    outcome = self.manager.release(
                        lease.work_item_id, success=False, error=exc, retry=retry
                    )
                break
            except (LeaseExpiredError, LeaseConflictError) as lost:
                logger.warning(
                    "lease on %s was lost before its failure could be recorded (%s); "
                    "the sweep or its new holder decides what happens next",
                    lease.work_item_id,
                    lost,
                )
                with self._counts_lock:
                    self._counts["lost"] += 1
                break
            except (DatabaseUnavailable, DatabaseError) as db_error:
                logger.warning(
                    "recording the failure of %s failed (%s); attempt %d/3",
                    lease.work_item_id,
                    _one_line(db_error),
                    attempt + 1,
                )
                _close_connection(self.using)
                time.sleep(0.2 * (attempt + 1))
        if outcome is not None:
            if outcome.will_retry:
                logger.info(
                    "retry scheduled for %s (%s) after %d ms: attempt %d/%d failed with %s",
                    lease.work_item_id,
                    lease.work_type,
                    elapsed_ms,
                    lease.retry_count + 1,
                    lease.max_retries + 1,
                    snapshot["error"],
                )
            else:
                logger.error(
                    "failed %s (%s) after %d ms: %s",
                    lease.work_item_id,
                    lease.work_type,
                    elapsed_ms,
                    snapshot["error"],
                )
            with self._counts_lock:
                key = "retried" if outcome.will_retry else "failed"
                self._counts[key] += 1
                if key == "failed":
                    self._unreported["failed"] += 1
        self._release_slot(lease.work_item_id)

    def _requeue(self, slot: _Slot, why: str) -> None:
        item_id = slot.lease.work_item_id
        if slot.context is not None:
            slot.context.mark_lease_lost(why)
        try:
            self.manager.requeue_lease(item_id)
        except (LeaseExpiredError, LeaseConflictError, DatabaseUnavailable, DatabaseError) as exc:
            logger.warning("could not hand back %s (%s); its lease will expire", item_id, exc)
        else:
            logger.info("handed back %s (%s): %s", item_id, slot.lease.work_type, why)
            with self._counts_lock:
                self._counts["requeued"] += 1
        self._release_slot(item_id)

    # --- heartbeats ------------------------------------------------------------------------

    def _renewable(self) -> dict[str, tuple[float, Heartbeat | None]]:
        """Leases the renewer keeps alive: all but running `beat`-mode ones.

        Beat-mode items are extended by their own beats once they start; until
        then (claimed but waiting for an executor) the renewer holds them.
        """
        with self._slots_lock:
            return {
                item_id: (slot.lease_duration, slot.heartbeat)
                for item_id, slot in self._slots.items()
                if not (slot.started and slot.spec.heartbeat == "beat" and not slot.finished)
            }

    def _on_lease_lost(self, item_id: str, error: BaseException) -> None:
        with self._slots_lock:
            slot = self._slots.get(item_id)
        if slot is None or slot.finished:
            # Finished: its completion is already on its way and the fence
            # decides; a renewal racing that completion is not a loss.
            return
        reason = _one_line(error)
        logger.warning("lease on %s lost: %s", item_id, reason)
        if slot.context is not None:
            slot.context.mark_lease_lost(reason)
        if not slot.started:
            # Never started: nothing to finish; the item belongs to the sweep now.
            with self._slots_lock:
                self._slots.pop(item_id, None)
            with self._counts_lock:
                self._counts["lost"] += 1

    def _report_progress(self) -> None:
        with self._counts_lock:
            completed, failed = self._unreported["completed"], self._unreported["failed"]
            self._unreported = {"completed": 0, "failed": 0}
        try:
            worker_registry.beat(
                self.worker_id, completed=completed, failed=failed, using=self.using
            )
        except BaseException:
            with self._counts_lock:
                self._unreported["completed"] += completed
                self._unreported["failed"] += failed
            raise

    # --- LISTEN/NOTIFY -------------------------------------------------------------------

    def _listen(self) -> None:
        import psycopg
        from psycopg import sql

        params = connections[self.using].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        while not self._stop.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.25):
                            if not self.queues or note.payload in self.queues:
                                self._notified.set()
                                self._wake.set()
            except psycopg.Error as exc:
                logger.debug("notify listener reconnecting: %s", exc)
                self._stop.wait(1.0)

    # --- shutdown --------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._stop.set()
        # Unstarted items go back at once; executors requeue any they pick up now.
        while True:
            try:
                slot = self._work.get_nowait()
            except queue.Empty:
                break
            if slot is not None:
                self._requeue(slot, "worker stopping before it started")
        deadline = time.monotonic() + self.shutdown_timeout
        while self._in_flight() and time.monotonic() < deadline:
            try:
                self._flush()
            except DatabaseUnavailable as exc:
                logger.warning("database unavailable during shutdown: %s", _one_line(exc))
                _close_connection(self.using)
            except DatabaseError as exc:
                if not is_transient_conflict(exc):
                    raise
                logger.warning("completion aborted during shutdown (%s); retrying", _one_line(exc))
            self._wait(0.05)
        try:
            self._flush()
        except DatabaseUnavailable as exc:
            logger.warning("could not record completions before exit: %s", _one_line(exc))
        with self._slots_lock:
            leftovers = list(self._slots.values())
        for slot in leftovers:
            self._requeue(
                slot, f"still running after the {self.shutdown_timeout:g}s shutdown timeout"
            )
        for _ in self._executors:
            self._work.put(None)
        if self._renewer is not None:
            self._renewer.stop(wait=True, timeout=5.0)
        try:
            self._report_progress()
            worker_registry.set_status(self.worker_id, WorkerStatus.STOPPED, using=self.using)
        except (DatabaseUnavailable, DatabaseError) as exc:
            logger.warning("could not mark worker %s stopped: %s", self.worker_id, _one_line(exc))
        if self._listener is not None:
            self._listener.join(timeout=1.0)

    def _log_summary(self) -> None:
        s = self.summary()
        logger.info(
            "summary %s: claimed %d, completed %d, failed %d, retried %d, lost %d, in flight %d, "
            "%.1f items/s",
            self.worker_id,
            s.claimed,
            s.completed,
            s.failed,
            s.retried,
            s.lost,
            self._in_flight(),
            s.completed / max(s.elapsed_seconds, 1e-9),
        )

    def _with_reconnect(self, fn: Any, *, what: str, attempts: int = 30) -> Any:
        for attempt in range(attempts):
            try:
                return fn()
            except DatabaseUnavailable as exc:
                if attempt == attempts - 1 or self._stop.is_set():
                    raise
                logger.warning("%s failed (%s); retrying", what, _one_line(exc))
                _close_connection(self.using)
                self._stop.wait(min(0.2 * 2**attempt, 5.0))
        return None


def _close_connection(using: str) -> None:
    try:
        connections[using].close()
    except Exception:  # already broken; Django opens a new one on next use
        logger.debug("closing a broken connection raised", exc_info=True)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


__all__ = ["Worker", "WorkerOptions", "WorkerSummary"]
