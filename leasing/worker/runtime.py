"""The worker runtime behind `runworker`: claim, run, record, renew, stop.

One process has a dispatcher (the thread that calls `run()`), which claims
batches with one statement and completes finished items with the next (on
PostgreSQL the same one); `concurrency` executors running handlers; one
renewer keeping the process's leases alive and its `workers` row fresh; on
PostgreSQL a listener woken by NOTIFY. Everything in flight is a `Slot`,
keyed by its lease (item and token).

Shutdown (SIGTERM/SIGINT or `stop()`): stop claiming, give running items up
to the shutdown timeout to finish, hand back what is left (`pending`, not a
retry), mark the `workers` row `stopped`. A second signal exits at once. A
dropped connection is logged, re-opened, and the worker carries on.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass

from django.db import DatabaseError

from ..exceptions import DatabaseUnavailable
from ..services import processes
from ..services.backlog import due_within
from ..services.completion import Completion, complete, complete_and_claim
from ..services.held import Lease
from ..services.leases import LeaseManager
from ..sql.dialect import Dialect
from ..sql.runner import close_connection, is_lock_conflict
from ..states import WorkerRole, WorkerStatus
from .executors import ExecutorPool
from .listener import NotifyListener
from .options import WorkerConfig, WorkerOptions, resolve
from .outcomes import Counters, Recorder, one_line
from .renewer import LeaseRenewer
from .signals import ShutdownSignals
from .slots import Slot, SlotState, SlotTable

logger = logging.getLogger("leasing.worker")

# Handlers faster than this on average let the dispatcher claim ahead.
FAST_HANDLER_SECONDS = 0.05
PREFETCH_AHEAD_SECONDS = 0.1
MAX_PREFETCH = 256


@dataclass(frozen=True, slots=True)
class WorkerSummary:
    worker_id: str
    claimed: int
    completed: int
    failed: int
    retried: int
    interrupted: int
    timed_out: int
    lost: int
    requeued: int
    elapsed_seconds: float
    reason: str


class WorkerRuntime:
    """A worker process's runtime. `run()` blocks until the worker stops."""

    def __init__(self, options: WorkerOptions | WorkerConfig | None = None) -> None:
        config = (
            options if isinstance(options, WorkerConfig) else resolve(options or WorkerOptions())
        )
        self.config = config
        self.worker_id = config.worker_id
        self.manager = LeaseManager(config.worker_id, using=config.using)
        self.slots = SlotTable()
        self.counters = Counters()
        self._finished: list[tuple[Slot, str | None]] = []
        self._finished_lock = threading.Lock()
        self._wake = threading.Event()  # something changed: look again
        self._freed = threading.Event()  # a slot ended, whatever its outcome
        self._notified = threading.Event()  # a NOTIFY said there is new work
        self._stop = threading.Event()
        self._exiting = False
        self._avg_run_seconds: float | None = None
        self._started_at = time.monotonic()
        self.recorder = Recorder(self.manager, self.counters, exiting=lambda: self._exiting)
        self.pool = ExecutorPool(
            concurrency=config.concurrency,
            using=config.using,
            slots=self.slots,
            recorder=self.recorder,
            extender_interval=config.extender_interval,
            heartbeat_intervals=dict(config.heartbeat_intervals),
            on_output=self._on_output,
            on_done=self._on_done,
            stopping=self._stop.is_set,
        )
        self.renewer = LeaseRenewer(
            self.manager,
            self.slots,
            interval_seconds=config.renew_interval,
            on_lease_lost=self._on_lease_lost,
            on_tick=self._report_progress,
            max_failures=config.heartbeat_max_failures,
        )
        self.listener: NotifyListener | None = None
        self.signals = ShutdownSignals(self._on_signal)

    # --- control -----------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        self.signals.install()

    def restore_signal_handlers(self) -> None:
        self.signals.restore()

    def _on_signal(self, name: str) -> None:
        logger.info(
            "%s received: no new claims; finishing running items (up to %gs)",
            name,
            self.config.shutdown_timeout,
        )
        self.stop()

    def stop(self) -> None:
        """Stop claiming and shut down gracefully."""
        self._stop.set()
        self._wake.set()

    def summary(self, reason: str = "running") -> WorkerSummary:
        c = self.counters
        with c.lock:
            return WorkerSummary(
                worker_id=self.worker_id,
                claimed=c.claimed,
                completed=c.completed,
                failed=c.failed,
                retried=c.retried,
                interrupted=c.interrupted,
                timed_out=c.timed_out,
                lost=c.lost,
                requeued=c.requeued,
                elapsed_seconds=time.monotonic() - self._started_at,
                reason=reason,
            )

    # --- the loop ----------------------------------------------------------------------

    def run(self) -> WorkerSummary:
        self._with_reconnect(self._register, what="registering the worker")
        c = self.config
        logger.info(
            "worker %s started: concurrency %d, work types %s, queues %s, lease %gs, heartbeat %gs",
            self.worker_id,
            c.concurrency,
            ", ".join(c.specs),
            ", ".join(c.filters.queues or ()) or "all",
            c.terms.duration,
            c.renew_interval,
        )
        self.pool.start()
        self.renewer.start()
        if c.listen_database is not None and Dialect(c.using).is_postgres:
            self.listener = NotifyListener(c.listen_database, c.filters.queues, self._on_notify)
            self.listener.start()
        reason = "stopped"
        try:
            reason = self._dispatch()
        finally:
            self._shutdown()
        summary = self.summary(reason)
        logger.info(
            "worker %s stopped (%s): claimed %d, completed %d, failed %d, retried %d, "
            "interrupted %d, timed out %d, lost %d, handed back %d",
            self.worker_id,
            reason,
            summary.claimed,
            summary.completed,
            summary.failed,
            summary.retried,
            summary.interrupted,
            summary.timed_out,
            summary.lost,
            summary.requeued,
        )
        return summary

    def _register(self) -> None:
        c = self.config
        processes.register(
            self.worker_id,
            WorkerRole.WORKER,
            heartbeat_interval=c.renew_interval,
            concurrency=c.concurrency,
            work_types=list(c.specs),
            queues=c.filters.queues or (),
            using=c.using,
        )

    def _dispatch(self) -> str:
        last_summary = time.monotonic()
        outages = 0
        while not self._stop.is_set():
            self._supervise()
            try:
                claimed = self._cycle()
                ended = None if claimed or len(self.slots) else self._idle_ending()
            except DatabaseUnavailable as exc:
                outages += 1
                delay = min(0.2 * 2 ** min(outages - 1, 5), 5.0)
                logger.warning(
                    "database unavailable (%s); reconnecting in %.1fs", one_line(exc), delay
                )
                close_connection(self.config.using)
                self._stop.wait(delay)
                continue
            except DatabaseError as exc:
                # SKIP LOCKED still waits for (and locks) a row version a
                # concurrent claim just updated, so busy workers' statements
                # can rarely deadlock; the aborted statement changed nothing.
                if not is_lock_conflict(exc):
                    raise
                logger.warning("claim/complete statement aborted (%s); retrying", one_line(exc))
                self._stop.wait(random.uniform(0.001, 0.02))
                continue
            if outages:
                logger.info("database connection restored after %d failed attempt(s)", outages)
                outages = 0
            if time.monotonic() - last_summary >= self.config.summary_interval:
                last_summary = time.monotonic()
                self._log_summary()
            if ended is not None:
                return ended
            if claimed:
                continue
            poll = self.config.poll_interval
            if self.config.burst and not len(self.slots):
                poll = min(poll, 0.05)  # a retry of ours is due soon: look again shortly
            self._wait_for_work(poll * random.uniform(0.8, 1.2))
        return "signal" if self.signals.received else "stopped"

    def _idle_ending(self) -> str | None:
        """Nothing in flight and nothing claimed: is the worker done?"""
        if self._max_items_reached():
            return "max-items"
        if self.config.burst and not due_within(
            self.config.poll_interval, self.config.filters, using=self.config.using
        ):
            return "burst-done"
        return None

    def _max_items_reached(self) -> bool:
        return self.config.max_items is not None and self.counters.claimed >= self.config.max_items

    def _capacity(self, finishing: int) -> int:
        c = self.config
        capacity = c.concurrency + self._prefetch() - (len(self.slots) - finishing)
        if c.max_items is not None:
            capacity = min(capacity, c.max_items - self.counters.claimed)
        return capacity

    def _prefetch(self) -> int:
        if self.config.prefetch is not None:
            return self.config.prefetch
        average = self._avg_run_seconds
        if average is not None and average < FAST_HANDLER_SECONDS:
            # Fast handlers: claim about PREFETCH_AHEAD_SECONDS of work ahead, so
            # executors stay busy while the dispatcher round-trips and each
            # round trip is a batch; slow work is never hoarded.
            ahead = int(PREFETCH_AHEAD_SECONDS / max(average, 1e-4))
            return min(MAX_PREFETCH, max(4 * self.config.concurrency, ahead))
        return 0

    def _cycle(self) -> int:
        """Complete what finished and claim what fits, in one round trip when possible."""
        with self._finished_lock:
            batch, self._finished = self._finished, []
        done = [(slot.lease, output) for slot, output in batch]
        capacity = self._capacity(len(batch))
        c = self.config
        try:
            if capacity > 0 and not self._stop.is_set():
                completion, leases = complete_and_claim(
                    self.manager, done, capacity, c.terms, c.filters
                )
            else:
                completion, leases = complete(self.manager, done), []
        except BaseException:
            with self._finished_lock:
                self._finished[:0] = batch  # written after reconnecting
            raise
        self._finish_batch(batch, completion)
        return self._dispatch_leases(leases)

    def _finish_batch(self, batch: list[tuple[Slot, str | None]], completion: Completion) -> None:
        slot_of = {slot.key: slot for slot, _ in batch}
        for lease in completion.completed:
            slot = slot_of[lease.key]
            logger.debug(
                "done %s (%s) in %d ms", lease.work_item_id, lease.work_type, slot.elapsed_ms()
            )
            self._on_done(slot)
        for lease in completion.lost:
            logger.warning(
                "lease on %s (%s, token %d) was lost before completion; result discarded "
                "(another run or the sweep owns it now)",
                lease.work_item_id,
                lease.work_type,
                lease.token,
            )
            self._on_done(slot_of[lease.key])
        for lease, reason in completion.unstorable:
            logger.error("failed %s (%s): %s", lease.work_item_id, lease.work_type, reason)
            self._on_done(slot_of[lease.key])
        if completion.unwritten:
            unwritten = {lease.key for lease, _ in completion.unwritten}
            with self._finished_lock:
                self._finished[:0] = [entry for entry in batch if entry[0].key in unwritten]
        self.counters.add(
            completed=len(completion.completed),
            lost=len(completion.lost),
            failed=len(completion.unstorable),
        )

    def _dispatch_leases(self, leases: list[Lease]) -> int:
        for lease in leases:
            spec = self.config.specs[lease.work_type]
            slot = Slot(lease, spec, self.config.terms.duration_for(lease.work_type))
            self.slots.add(slot)
            logger.debug(
                "claimed %s (%s, token %d, attempt %d/%d)",
                lease.work_item_id,
                lease.work_type,
                lease.token,
                lease.retry_count + 1,
                lease.max_retries + 1,
            )
            self.pool.submit(slot)
        if leases:
            self.counters.add(claimed=len(leases))
        return len(leases)

    # --- waiting -----------------------------------------------------------------------

    def _wait_for_work(self, timeout: float) -> None:
        """Sleep until something is worth a round trip, or `timeout` passes.

        Worth it: a NOTIFY, a freed slot (whatever its outcome), or finished
        items waiting while the executors are about to run dry or a full batch
        has piled up; waiting for that lets one statement complete and claim
        many items at once.
        """
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            if self._notified.is_set() or self._freed.is_set():
                self._notified.clear()
                self._freed.clear()
                return
            with self._finished_lock:
                finished = len(self._finished)
            if finished and (
                self.pool.backlog() < self.config.concurrency
                or finished >= max(1, self._prefetch())
            ):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wake.wait(min(remaining, self._next_deadline_in()))
            self._wake.clear()

    def _next_deadline_in(self) -> float:
        """Seconds until the earliest running lease reaches its cap (so it is not overslept)."""
        now = time.monotonic()
        deadlines = [
            slot.deadline() - now for slot in self.slots if slot.state is SlotState.RUNNING
        ]
        return max(0.01, min(deadlines, default=3600.0))

    def _on_notify(self) -> None:
        self._notified.set()
        self._wake.set()

    def _on_output(self, slot: Slot, output_json: str | None) -> None:
        elapsed = slot.elapsed_ms() / 1000
        average = self._avg_run_seconds
        self._avg_run_seconds = elapsed if average is None else 0.8 * average + 0.2 * elapsed
        with self._finished_lock:
            self._finished.append((slot, output_json))
        self._wake.set()

    def _on_done(self, slot: Slot) -> None:
        self.slots.remove(slot)
        self._freed.set()
        self._wake.set()

    # --- keeping watch ------------------------------------------------------------------

    def _supervise(self) -> None:
        """Replace dead executors, hand back their runs, time out runs past their deadline."""
        for slot in self.pool.supervise():
            self.recorder.hand_back(slot, "its executor thread died")
            self._on_done(slot)
        now = time.monotonic()
        for slot in self.slots:
            if now < slot.deadline():
                continue
            executor = slot.executor
            if self.slots.transition(slot, SlotState.RUNNING, SlotState.ABANDONED):
                slot.lose(f"timed out after {round(slot.lease.cap_seconds)} s")
                self.recorder.time_out(slot)
                if executor is not None:
                    self.pool.retire(
                        executor, f"its handler of {slot.lease.work_item_id} timed out"
                    )
                self._on_done(slot)
            elif self.slots.transition(slot, SlotState.QUEUED, SlotState.ABANDONED):
                self.recorder.hand_back(slot, "it waited past its lease's deadline")
                self._on_done(slot)

    def _on_lease_lost(self, slot: Slot, error: BaseException) -> None:
        """The renewer could not keep a lease: the run must stop writing."""
        if slot.state is SlotState.FINISHED:
            return  # its outcome is being written; the fence decides
        logger.warning(
            "lease on %s (token %d) lost: %s",
            slot.lease.work_item_id,
            slot.lease.token,
            one_line(error),
        )
        slot.lose(one_line(error))
        if self.slots.transition(slot, SlotState.QUEUED, SlotState.ABANDONED):
            # Never started: nothing to finish; the item belongs to the sweep now.
            self.counters.add(lost=1)
            self._on_done(slot)

    def _report_progress(self) -> None:
        c = self.counters
        with c.lock:
            completed, failed = c.unreported_completed, c.unreported_failed
            c.unreported_completed = c.unreported_failed = 0
        try:
            processes.beat(
                self.worker_id, completed=completed, failed=failed, using=self.config.using
            )
        except BaseException:
            with c.lock:
                c.unreported_completed += completed
                c.unreported_failed += failed
            raise

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
            len(self.slots),
            s.completed / max(s.elapsed_seconds, 1e-9),
        )

    # --- shutdown ------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + self.config.shutdown_timeout
        while len(self.slots) and time.monotonic() < deadline:
            self._flush()
            self._supervise()
            self._wait_for_work(0.05)
        self._flush()
        for slot in self.slots:
            if self.slots.transition(slot, SlotState.RUNNING, SlotState.ABANDONED) or (
                self.slots.transition(slot, SlotState.QUEUED, SlotState.ABANDONED)
            ):
                slot.lose("the worker is stopping")
                self.recorder.hand_back(
                    slot,
                    f"still running after the {self.config.shutdown_timeout:g}s shutdown timeout",
                )
                self._on_done(slot)
        self._flush_until_written()
        self.pool.stop()
        self.renewer.stop()
        try:
            self._report_progress()
            processes.set_status(self.worker_id, WorkerStatus.STOPPED, using=self.config.using)
        except (DatabaseUnavailable, DatabaseError) as exc:
            logger.warning("could not mark worker %s stopped: %s", self.worker_id, one_line(exc))
        if self.listener is not None:
            self.listener.stop()

    def _flush(self) -> None:
        """Complete finished items (no claims); database trouble is retried later."""
        try:
            self._cycle_complete_only()
        except (DatabaseUnavailable, DatabaseError) as exc:
            if isinstance(exc, DatabaseError) and not (is_lock_conflict(exc)):
                raise
            logger.warning("completing finished items failed during shutdown: %s", one_line(exc))
            close_connection(self.config.using)

    def _cycle_complete_only(self) -> None:
        with self._finished_lock:
            batch, self._finished = self._finished, []
        try:
            completion = complete(self.manager, [(slot.lease, output) for slot, output in batch])
        except BaseException:
            with self._finished_lock:
                self._finished[:0] = batch
            raise
        self._finish_batch(batch, completion)

    def _flush_until_written(self) -> None:
        """Do not exit holding finished results the database has not taken yet.

        Tries until they are written, or their leases surely ran out (the sweep
        owns them then).
        """
        while True:
            with self._finished_lock:
                pending = [slot for slot, _ in self._finished if not slot.lease_surely_expired()]
                if not pending:
                    self._finished.clear()
                    return
            self._flush()
            if self._finished:
                time.sleep(0.2)

    def _with_reconnect(self, fn: object, *, what: str, attempts: int = 30) -> None:
        for attempt in range(attempts):
            try:
                fn()  # type: ignore[operator]
                return
            except DatabaseUnavailable as exc:
                if attempt == attempts - 1 or self._stop.is_set():
                    raise
                logger.warning("%s failed (%s); retrying", what, one_line(exc))
                close_connection(self.config.using)
                self._stop.wait(min(0.2 * 2**attempt, 5.0))
