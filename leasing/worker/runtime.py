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

from django.db import DatabaseError

from ..exceptions import DatabaseUnavailable
from ..services import processes
from ..services.backlog import due_within
from ..services.leases import LeaseManager
from ..sql.runner import close_connection, is_lock_conflict
from ..states import WorkerRole, WorkerStatus
from ..storage import storage_for
from .dispatcher import Dispatcher
from .executors import ExecutorPool
from .leadership import Leadership, claim_key
from .listener import NotifyListener
from .options import WorkerConfig, WorkerOptions, resolve
from .outcomes import Counters, Recorder, WorkerSummary, one_line
from .renewer import LeaseRenewer
from .slots import Slot, SlotState, SlotTable
from .stopping import ShutdownSignals
from .watch import Watch

logger = logging.getLogger("leasing.worker")


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
        self._wake = threading.Event()  # something changed: look again
        self._freed = threading.Event()  # a slot ended, whatever its outcome
        self._notified = threading.Event()  # a NOTIFY said there is new work
        self._stop = threading.Event()
        self._exiting = False
        self._started_at = time.monotonic()
        self.recorder = Recorder(self.manager, self.counters, exiting=lambda: self._exiting)
        self.pool = ExecutorPool(
            concurrency=config.concurrency,
            using=config.using,
            slots=self.slots,
            recorder=self.recorder,
            on_output=lambda slot, output: self.dispatcher.on_output(slot, output),
            on_done=self._on_done,
            stopping=self._stop.is_set,
        )
        # The dispatcher frees the slots it completes itself: it claims into
        # them in the same round trip, so it needs no wake-up for them.
        self.dispatcher = Dispatcher(
            config,
            self.manager,
            self.slots,
            self.pool,
            self.counters,
            on_done=self.slots.remove_all,
            wake=self._wake.set,
        )
        self.watch = Watch(self.slots, self.pool, self.recorder, self.counters, self._on_done)
        self.renewer = LeaseRenewer(
            self.manager,
            self.slots,
            interval_seconds=config.renew_interval,
            on_lease_lost=self.watch.lease_lost,
            on_tick=self._report_progress,
            max_failures=config.heartbeat_max_failures,
            heartbeat_intervals=config.heartbeat_intervals,
            extender_interval=config.extender_interval,
        )
        self.listener: NotifyListener | None = None
        self.leadership: Leadership | None = None
        self.signals = ShutdownSignals(self._on_signal, on_forced=self._hand_back_all)

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

    def _hand_back_all(self) -> int:
        """A forced stop: give every run in flight back at once (one statement)."""
        self._stop.set()
        try:
            return self.manager.requeue_all([slot.key for slot in self.slots])
        finally:
            close_connection(self.config.using)  # this thread's own

    def stop(self) -> None:
        """Stop claiming and shut down gracefully."""
        self._stop.set()
        self._wake.set()

    def summary(self, reason: str = "running") -> WorkerSummary:
        elapsed = time.monotonic() - self._started_at
        return self.counters.summary(self.worker_id, elapsed, reason)

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
        if c.listen_database is not None and storage_for(c.using).can_listen:
            self.leadership = leadership = Leadership(claim_key(c.filters), self._has_room)
            self.listener = NotifyListener(
                c.listen_database, c.filters.queues, self._on_notify, self.leadership
            )
            self.dispatcher.leads = lambda: leadership.leading
            self.listener.start()
        reason = "stopped"
        try:
            reason = self._dispatch()
        finally:
            self._shutdown()
        summary = self.summary(reason)
        logger.info(
            "worker %s stopped (%s): claimed %d, completed %d, failed %d, retried %d, "
            "interrupted %d, timed out %d, lost %d, handed back %d, cancelled %d",
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
            summary.cancelled,
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
            self.watch.supervise()
            try:
                claimed = self.dispatcher.cycle(claiming=True)
                if self.leadership is not None:
                    self.leadership.claimed(self.dispatcher.last_asked, claimed)
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
            if claimed and not self.dispatcher.scarce:
                continue
            poll = self.config.poll_interval
            if self.config.burst and not len(self.slots):
                poll = min(poll, 0.05)  # a retry of ours is due soon: look again shortly
            self._wait_for_work(poll * random.uniform(0.8, 1.2))
        return "signal" if self.signals.received else "stopped"

    def _idle_ending(self) -> str | None:
        """Nothing in flight and nothing claimed: is the worker done?"""
        if self.dispatcher.max_items_reached():
            return "max-items"
        if self.config.burst and not due_within(
            self.config.poll_interval, self.config.filters, using=self.config.using
        ):
            return "burst-done"
        return None

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
            if self.dispatcher.worth_a_round_trip():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wake.wait(min(remaining, self._next_deadline_in(), self.dispatcher.due_in()))
            self._wake.clear()

    def _next_deadline_in(self) -> float:
        """Seconds until the earliest run in flight reaches its cap (so it is not overslept)."""
        return max(0.01, min(self.slots.earliest_deadline() - time.monotonic(), 3600.0))

    def _on_notify(self) -> None:
        self._notified.set()
        self._wake.set()

    def _has_room(self) -> bool:
        """Whether this worker would claim now (a stopping worker claims nothing)."""
        return not self._stop.is_set() and self.dispatcher.has_room()

    def _on_done(self, slot: Slot) -> None:
        self.slots.remove(slot)
        self._freed.set()
        self._wake.set()

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
            self.dispatcher.flush()
            self.watch.supervise()
            self._wait_for_work(0.05)
        self.dispatcher.flush()
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
        self.dispatcher.flush_until_written()
        self.pool.stop()
        self.renewer.stop()
        try:
            self._report_progress()
            processes.set_status(self.worker_id, WorkerStatus.STOPPED, using=self.config.using)
        except (DatabaseUnavailable, DatabaseError) as exc:
            logger.warning("could not mark worker %s stopped: %s", self.worker_id, one_line(exc))
        if self.listener is not None:
            self.listener.stop()

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
