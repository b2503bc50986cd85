"""The worker runtime behind `runworker`: claim, run, record, renew, stop.

One process has a dispatcher (the thread that calls `run()`), which claims
batches with one statement and completes finished items with the next (on
PostgreSQL the same one); `concurrency` executors running handlers; one
renewer keeping the process's leases alive and its `workers` row fresh; on
PostgreSQL a listener woken by NOTIFY. Everything in flight is a `Slot`,
keyed by its lease (item and token).

Shutdown (SIGTERM/SIGINT or `stop()`): stop claiming, give running items up
to the shutdown timeout to finish, hand back what is left (`pending`, not a
retry), mark the `workers` row `stopped`. A second signal hands the running
items back at once and exits. A dropped connection is logged, re-opened, and
the worker carries on.

A run fenced out while its handler thread still runs (timed out, its lease
lost, force-released) is an abandoned run (`AbandonedRuns`): counted on every
beat in the `workers` row, never re-claimed by this process while it runs.
Past `LEASING["MAX_ABANDONED_RUNS"]` of them the worker claims nothing,
finishes its running items and exits with `EXIT_ABANDONED_RUNS` so the
service manager starts a fresh process (threads cannot be killed; a process
can). A renewer thread that ended stops the worker the same way (as a SIGTERM
does), with `EXIT_THREAD_ENDED`.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from datetime import timedelta

from django.db import DatabaseError

from ..conf import get_settings
from ..exceptions import DatabaseUnavailable, LeaseConflictError
from ..services import processes
from ..services.backlog import due_within
from ..services.held import Lease
from ..services.leases import LeaseManager
from ..sql.processes import RunReport
from ..sql.runner import (
    close_connection,
    is_infrastructure_error,
    is_lock_conflict,
    until_reachable,
)
from ..states import WorkerRequest, WorkerRole, WorkerStatus
from ..storage import storage_for
from .dispatcher import Dispatcher
from .executors import Executor, ExecutorPool
from .leadership import Leadership, claim_key
from .listener import NotifyListener
from .options import WorkerConfig, WorkerOptions, resolve
from .outcomes import Counters, Recorder, WorkerSummary, one_line
from .renewer import LeaseRenewer
from .slots import AbandonedRuns, Slot, SlotState, SlotTable
from .stopping import FORCED_STATEMENT_TIMEOUT, ShutdownSignals
from .watch import Watch

logger = logging.getLogger("leasing.worker")

# The exit status of a worker that stopped because too many of its runs were abandoned
# (EX_TEMPFAIL: start it again). Documented with the systemd unit.
EXIT_ABANDONED_RUNS = 75
# The `WorkerSummary.reason` of that ending.
TOO_MANY_ABANDONED = "too-many-abandoned-runs"
# The exit status of a worker that stopped because a thread it cannot work without
# ended (EX_SOFTWARE: a fault of the process; start it again), and that ending's reason.
EXIT_THREAD_ENDED = 70
THREAD_ENDED = "essential-thread-ended"
# The exit status of `runworker` for each ending that asks for a fresh process.
EXIT_STATUSES = {TOO_MANY_ABANDONED: EXIT_ABANDONED_RUNS, THREAD_ENDED: EXIT_THREAD_ENDED}


class WorkerRuntime:
    """A worker process's runtime. `run()` blocks until the worker stops."""

    def __init__(self, options: WorkerOptions | WorkerConfig | None = None) -> None:
        config = (
            options if isinstance(options, WorkerConfig) else resolve(options or WorkerOptions())
        )
        self.config = config
        self.worker_id = config.worker_id
        self.manager = LeaseManager(config.worker_id, using=config.using)
        self.slots = SlotTable(start_clock=self._start_clock)
        self.abandoned = AbandonedRuns()
        settings = get_settings()
        self.max_abandoned_runs = settings.max_abandoned_runs
        self.max_lease_lifetime = settings.max_lease_lifetime
        self.counters = Counters()
        self._wake = threading.Event()  # something changed: look again
        self._freed = threading.Event()  # a slot ended, whatever its outcome
        self._notified = threading.Event()  # a NOTIFY said there is new work
        self._stop = threading.Event()
        self._exiting = False
        self._over_bound_logged = False
        self._quiet = False  # an operator asked it to claim nothing more
        self._abandoned_reported = 0  # of `abandoned.total`, added to the workers row
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
            executions=config.executions,
            process_max_items=config.process_max_items,
            process_max_memory_mb=config.process_max_memory_mb,
            process_stop_grace=config.process_stop_grace,
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
            excluded=self._abandoned_item_ids,
            screen=self._screen_claims,
        )
        self.watch = Watch(
            self.slots, self.pool, self.recorder, self.counters, self._on_done, self.abandoned
        )
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
        self.signals = ShutdownSignals(
            self._on_signal, on_forced=self._hand_back_all, on_exit=self.pool.kill_children
        )

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
        """A forced stop: give every run in flight back at once (one statement).

        The statement is bounded by `FORCED_STATEMENT_TIMEOUT` (a
        `statement_timeout` on PostgreSQL), so a row lock held elsewhere cancels
        it on the server rather than leave it waiting after the process is gone.
        """
        self._stop.set()
        using = self.config.using
        try:
            storage_for(using).bound_statements(FORCED_STATEMENT_TIMEOUT)
            return self.manager.requeue_all([slot.key for slot in self.slots])
        finally:
            close_connection(using)  # this thread's own

    def stop(self) -> None:
        """Stop claiming and shut down gracefully."""
        self._stop.set()
        self._wake.set()

    def summary(self, reason: str = "running") -> WorkerSummary:
        elapsed = time.monotonic() - self._started_at
        return self.counters.summary(self.worker_id, elapsed, reason)

    # --- the loop ----------------------------------------------------------------------

    def run(self) -> WorkerSummary:
        until_reachable(
            self._register, what="registering the worker", using=self.config.using, stop=self._stop
        )
        if self.config.id_given:  # a generated id is new: nothing held it before
            self._let_earlier_leases_go()
        c = self.config
        logger.info(
            "worker %s started: concurrency %d, queues %s, work types %s",
            self.worker_id,
            c.concurrency,
            ", ".join(c.filters.queues or ()) or "all",
            ", ".join(
                f"{work_type} (lease {c.terms.duration_for(work_type):g}s, heartbeat "
                f"{c.heartbeat_intervals.get(work_type, c.renew_interval):g}s)"
                for work_type in c.specs
            ),
        )
        self.pool.start()
        self.renewer.start()
        if c.listen_database is not None and storage_for(c.using).can_listen:
            self.leadership = leadership = Leadership(claim_key(c.filters), self._has_room)
            self.listener = NotifyListener(
                c.listen_database, c.filters.queues, self._on_notify, self.leadership
            )
            self.dispatcher.leads = lambda: leadership.leading
            self.dispatcher.trickling = lambda: leadership.trickle
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

    def _let_earlier_leases_go(self) -> None:
        """A restart under the same worker id (say a systemd instance's) must not pass the
        dead process's leases off as live ones of this worker: nothing renews them."""
        try:
            earlier = self.manager.expire_earlier_leases()
        except (DatabaseUnavailable, DatabaseError) as exc:  # they run out on their own
            logger.warning("could not expire the earlier process's leases: %s", one_line(exc))
            return
        if earlier:
            logger.warning(
                "worker %s: %d lease(s) of its earlier process (%s) expire now; the sweep "
                "recovers them",
                self.worker_id,
                len(earlier),
                ", ".join(earlier[:10]) + (", ..." if len(earlier) > 10 else ""),
            )

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
        polled = False  # the last wait ended by its timeout, not by a wake
        while not self._stop.is_set():
            self.watch.supervise()
            if self._essential_thread_ended():
                return THREAD_ENDED
            claiming = not self._quiet and not self._too_many_abandoned()
            try:
                started_at = time.monotonic()
                claimed = self.dispatcher.cycle(claiming=claiming, polled=polled)
                if self.leadership is not None:
                    self.leadership.claimed(self.dispatcher.last_asked, claimed, started_at)
                ended = None if claimed or len(self.slots) else self._idle_ending()
            except (DatabaseUnavailable, DatabaseError) as exc:
                if isinstance(exc, DatabaseError) and is_lock_conflict(exc):
                    # SKIP LOCKED still waits for (and locks) a row version a
                    # concurrent claim just updated, so busy workers' statements
                    # can rarely deadlock; the aborted statement changed nothing.
                    logger.warning("claim/complete statement aborted (%s); retrying", one_line(exc))
                    self._stop.wait(random.uniform(0.001, 0.02))
                    continue
                # An outage, also one met at a COMMIT (outside the statements'
                # own translation): reconnect and go on, never exit for it.
                if not is_infrastructure_error(exc):
                    raise
                outages += 1
                delay = min(0.2 * 2 ** min(outages - 1, 5), 5.0)
                logger.warning(
                    "database unavailable (%s); reconnecting in %.1fs", one_line(exc), delay
                )
                close_connection(self.config.using)
                self._stop.wait(delay)
                continue
            if outages:
                logger.info("database connection restored after %d failed attempt(s)", outages)
                outages = 0
            if time.monotonic() - last_summary >= self.config.summary_interval:
                last_summary = time.monotonic()
                self._log_summary()
            if ended is not None:
                return ended
            polled = False
            if claimed and not self.dispatcher.scarce:
                continue
            poll = self.config.poll_interval
            if self.config.burst and not len(self.slots):
                poll = min(poll, 0.05)  # a retry of ours is due soon: look again shortly
            rate_wait = self.dispatcher.manager.rate_wait
            if rate_wait is not None and rate_wait < poll:
                # A rate limit holds items back: sleep until it opens, not a whole poll.
                self._wait_for_work(rate_wait)  # not a poll: the items held back are due
                continue
            polled = self._wait_for_work(poll * random.uniform(0.8, 1.2))
        return "signal" if self.signals.received else "stopped"

    def _essential_thread_ended(self) -> bool:
        """Whether a thread the worker cannot go on without has ended: then it stops.

        The renewer keeps its leases and its `workers` row alive: without it
        every run's lease runs out while the worker goes on claiming. (Executors
        are replaced by `Watch.supervise`; without the listener the worker polls.)
        """
        if self.renewer.is_running():
            return False
        logger.error(
            "worker %s exits with status %d: its lease renewer thread ended, so nothing "
            "renews its leases or beats its workers row; running items finish or are handed "
            "back, and a fresh process takes over",
            self.worker_id,
            EXIT_THREAD_ENDED,
        )
        return True

    def _idle_ending(self) -> str | None:
        """Nothing in flight and nothing claimed: is the worker done?"""
        if self._too_many_abandoned():
            logger.error(
                "worker %s exits with status %d: %d abandoned run(s), more than "
                "LEASING['MAX_ABANDONED_RUNS'] (%d); a fresh process frees their threads",
                self.worker_id,
                EXIT_ABANDONED_RUNS,
                len(self.abandoned),
                self.max_abandoned_runs,
            )
            return TOO_MANY_ABANDONED
        if self._quiet:
            return None  # it waits, beating, until it is stopped
        if self.dispatcher.max_items_reached():
            return "max-items"
        if self.config.burst and not due_within(
            self.config.poll_interval, self.config.filters, using=self.config.using
        ):
            return "burst-done"
        rate_wait = self.dispatcher.manager.rate_wait
        if self.config.burst and rate_wait is not None and rate_wait > self.config.poll_interval:
            # What is due waits behind a rate limit for longer than a poll (a bucket of
            # one a day, say): a burst takes what it can now, it does not wait for that.
            return "burst-done"
        return None

    # --- waiting -----------------------------------------------------------------------

    def _wait_for_work(self, timeout: float) -> bool:
        """Sleep until something is worth a round trip, or `timeout` passes (then True).

        Worth it: a NOTIFY, a freed slot (whatever its outcome), the next claim
        of a trickle this worker leads, or finished items waiting while the
        executors are about to run dry or a full batch has piled up; waiting for
        that lets one statement complete and claim many items at once.
        """
        deadline = time.monotonic() + timeout
        lead = self.leadership
        while not self._stop.is_set():
            if self._notified.is_set() or self._freed.is_set():
                self._notified.clear()
                self._freed.clear()
                return False
            if self.dispatcher.worth_a_round_trip():
                return False
            if self.slots.earliest_deadline() <= time.monotonic():
                # A run reached its deadline, or a run that waited for its executor moved
                # its deadline to count from its start: end what is due, read the next.
                self.watch.supervise()
                continue
            remaining = deadline - time.monotonic()
            trickle_in = lead.trickle_due_in() if lead is not None else math.inf
            if remaining <= 0:
                return True
            if trickle_in <= 0:
                return False
            self._wake.wait(
                min(remaining, self._next_deadline_in(), self.dispatcher.due_in(), trickle_in)
            )
            self._wake.clear()
        return False

    def _next_deadline_in(self) -> float:
        """Seconds until the earliest run in flight reaches its cap (so it is not overslept)."""
        return max(0.01, min(self.slots.earliest_deadline() - time.monotonic(), 3600.0))

    def _on_notify(self) -> None:
        self._notified.set()
        self._wake.set()

    def _has_room(self) -> bool:
        """Whether this worker would claim now (a stopping worker claims nothing)."""
        return (
            not self._stop.is_set()
            and not self._quiet
            and not self._too_many_abandoned()
            and self.dispatcher.has_room()
        )

    def _too_many_abandoned(self) -> bool:
        """Past the bound: claim nothing, finish what runs, then exit (`_idle_ending`).

        Counted afresh each time: an abandoned handler that lets go brings the
        worker back under the bound, and it claims again.
        """
        over = len(self.abandoned.alive()) > self.max_abandoned_runs
        if over and not self._over_bound_logged:
            self._over_bound_logged = True
            logger.error(
                "%d abandoned run(s), more than LEASING['MAX_ABANDONED_RUNS'] (%d): claiming "
                "nothing; the worker exits once its running items are done",
                len(self.abandoned),
                self.max_abandoned_runs,
            )
        elif not over:
            self._over_bound_logged = False
        return over

    def _screen_claims(self, slots: list[Slot]) -> list[Slot]:
        """Claimed runs of items whose earlier run still runs here are handed back at once.

        A new claim of an item this process still runs means the old run was
        fenced out (force-released, swept) before the renewer noticed: it is
        abandoned now, and its item is left to other workers while its thread
        runs.
        """
        running = {
            slot.lease.work_item_id: slot
            for executor in list(self.pool.executors)
            if (slot := executor.slot) is not None
        }
        abandoned = set(self._abandoned_item_ids()) if len(self.abandoned) else set()
        if not running and not abandoned:
            return slots
        keep = []
        for slot in slots:
            item_id = slot.lease.work_item_id
            old = running.get(item_id)
            if old is not None and old.key != slot.key:
                self.watch.lease_lost(
                    old, LeaseConflictError(f"claimed again with token {slot.lease.token}")
                )
            if old is not None or item_id in abandoned:
                self.recorder.hand_back(slot, "its earlier run still runs in this process")
                continue
            keep.append(slot)
        return keep

    def _start_clock(self, slot: Slot, executor: Executor) -> Lease | None:
        """A timed run that waited in this process starts: its timeout counts from now.

        The database moves the lease's deadline (fenced by its token), so the
        sweep and the console see the deadline this process keeps. If that
        cannot be done (the database is unreachable, the lease is gone), the
        run does not start: it is handed back (fenced), no attempt counted.
        """
        lease, spec = slot.lease, slot.spec
        lifetime = spec.max_lease_lifetime or self.max_lease_lifetime
        if spec.timeout is None or spec.timeout >= lifetime:
            return lease  # its deadline is its lifetime, which counts from the claim
        try:
            # The executor would check its connection next; a dead one must not cost the run.
            self.pool.check_connection(executor)
            started = self.manager.start_clock(
                lease, spec.timeout, lease.acquired_at + timedelta(seconds=lifetime)
            )
        except (DatabaseUnavailable, DatabaseError) as exc:
            if not is_infrastructure_error(exc):
                logger.exception("moving the deadline of %s failed", lease.work_item_id)
            else:
                close_connection(self.config.using)
            why = f"its deadline could not be moved to its start ({one_line(exc)})"
        else:
            if started is not None:
                return started
            why = "its lease ran out before it started"
        if self.slots.transition(slot, SlotState.QUEUED, SlotState.ABANDONED):
            slot.lose(why)
            self.recorder.hand_back(slot, why)
            self._on_done(slot)
        return None

    def _abandoned_item_ids(self) -> tuple[str, ...]:
        """Items this process must not claim: their earlier run still runs here."""
        ids = [slot.lease.work_item_id for slot in self.abandoned.alive()]
        if self.pool.uses_children:
            # A run in a child that was fenced out is not an abandoned run (its child
            # is stopped), but until the child is gone (up to PROCESS_STOP_GRACE and
            # then SIGKILL) a claim of its item would be handed straight back, and
            # claimed again the next round.
            ids += [
                slot.lease.work_item_id
                for executor in list(self.pool.executors)
                if (slot := executor.slot) is not None and slot.state is SlotState.ABANDONED
            ]
        return tuple(ids)

    def _on_done(self, slot: Slot) -> None:
        self.slots.remove(slot)
        self._freed.set()
        self._wake.set()

    def _report_progress(self) -> None:
        c = self.counters
        with c.lock:
            completed, failed = c.unreported_completed, c.unreported_failed
            c.unreported_completed = c.unreported_failed = 0
        runs = self._run_report()
        try:
            answer = processes.beat(
                self.worker_id,
                completed=completed,
                failed=failed,
                runs=runs,
                using=self.config.using,
            )
        except BaseException:
            with c.lock:
                c.unreported_completed += completed
                c.unreported_failed += failed
            raise
        self._abandoned_reported += runs.newly_abandoned
        if answer is not None and answer.requested is not None and self._honour(answer):
            # The row says so now, not a beat later.
            processes.beat(self.worker_id, runs=self._run_report(), using=self.config.using)

    def _honour(self, request: processes.Beat) -> bool:
        """An operator's quiet or stop (read by this beat): acted on once; True if it was now."""
        if request.requested == WorkerRequest.STOP and not self._stop.is_set():
            logger.warning(
                "stop requested by %s (%s): no new claims; finishing running items (up to %gs)",
                request.by,
                request.reason,
                self.config.shutdown_timeout,
            )
            self.stop()
            return True
        if request.requested == WorkerRequest.QUIET and not self._quiet:
            logger.warning(
                "quiet requested by %s (%s): no new claims; running items finish",
                request.by,
                request.reason,
            )
            self._quiet = True
            self._wake.set()
            return True
        return False

    def _run_report(self) -> RunReport:
        """The runs as the `workers` row shows them after this beat."""
        busy = sum(1 for slot in self.slots if slot.state is SlotState.RUNNING)
        abandoned = len(self.abandoned.alive())
        return RunReport(
            busy=busy,
            abandoned=abandoned,
            newly_abandoned=self.abandoned.total - self._abandoned_reported,
            quiet=self._stop.is_set() or self._quiet or abandoned > self.max_abandoned_runs,
        )

    def _log_summary(self) -> None:
        s = self.summary()
        logger.info(
            "summary %s: claimed %d, completed %d, failed %d, retried %d, lost %d, in flight %d, "
            "abandoned %d, %.1f items/s",
            self.worker_id,
            s.claimed,
            s.completed,
            s.failed,
            s.retried,
            s.lost,
            len(self.slots),
            len(self.abandoned),
            s.completed / max(s.elapsed_seconds, 1e-9),
        )

    # --- shutdown ------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + self.config.shutdown_timeout
        if len(self.slots):  # the console says so while the running items finish
            try:
                processes.set_status(self.worker_id, WorkerStatus.STOPPING, using=self.config.using)
            except (DatabaseUnavailable, DatabaseError) as exc:
                logger.warning(
                    "could not mark worker %s stopping: %s", self.worker_id, one_line(exc)
                )
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
