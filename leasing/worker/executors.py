"""Executor threads: each runs one handler at a time, with its own database connection.

Nothing a handler raises kills its executor: every exception (`SystemExit`,
`KeyboardInterrupt` and `GeneratorExit` included) ends the run as a failure,
an interruption or a permanent failure, and the executor takes the next slot.
If an executor thread dies all the same, the dispatcher's `supervise()` hands
its run's lease back and starts a new executor; an executor whose handler
outlived its lease's deadline is retired the same way, so the process keeps
`concurrency` executors that can work.

A work type in `process` mode runs in the executor's child process
(`leasing.worker.children`): the executor waits for its answer and stops the
child when the run must stop, so such an executor is never retired for a
stuck handler.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .. import tracing, validation
from ..context import WorkContext
from ..exceptions import Cancelled
from ..sql.runner import (
    IDLE_CHECK_SECONDS,
    HangUpWatch,
    TransactionLeftOpen,
    close_connection,
    refresh_connection,
)
from .child import end_handler_transactions
from .children import START_TIMEOUT, Child, ChildAnswer, ChildProcessDied
from .outcomes import Recorder
from .slots import Slot, SlotState, SlotTable

logger = logging.getLogger("leasing.worker")


class Executor(threading.Thread):
    """One handler thread; `slot` is the run it is on (None between runs)."""

    def __init__(self, pool: ExecutorPool, index: int) -> None:
        super().__init__(name=f"executor-{index}", daemon=True)
        self.pool = pool
        self.slot: Slot | None = None
        self.retired = False
        self.last_used = time.monotonic()
        self.connection: BaseDatabaseWrapper | None = None
        self.hang_up = HangUpWatch()
        # Its child process, when the worker runs a type in `process` mode.
        self.child: Child | None = pool.new_child(self.name)
        # Set once it can take a run (its child started, or failed to).
        self.ready = threading.Event()

    def run(self) -> None:
        # This thread's connection wrapper, looked up once (a lookup per run
        # goes through asgiref's thread-local, a measurable share of a quick item).
        self.connection = connections[self.pool.using]
        try:
            if self.child is not None:
                # Started here, once: a child that cannot start fails its first run instead.
                try:
                    self.child.start()
                except ChildProcessDied as exc:
                    logger.error("%s: %s", self.name, exc)
            self.ready.set()
            while not self.retired:
                slot = self.pool.take()
                if slot is None:
                    return
                self.slot = slot
                self.pool.execute(self, slot)
                self.slot = None
                self.last_used = time.monotonic()
        finally:
            if self.child is not None:
                self.child.close(self.pool.process_stop_grace)
            close_connection(self.pool.using)


class ExecutorPool:
    """`concurrency` executors fed from one queue of claimed slots."""

    def __init__(
        self,
        *,
        concurrency: int,
        using: str,
        slots: SlotTable,
        recorder: Recorder,
        on_output: Callable[[Slot, str | None], None],
        on_done: Callable[[Slot], None],
        stopping: Callable[[], bool],
        executions: Mapping[str, str] | None = None,
        process_max_items: int = 1000,
        process_max_memory_mb: int = 1024,
        process_stop_grace: float = 5.0,
    ) -> None:
        self.concurrency = concurrency
        # Work type -> "thread" or "process"; a type not named runs in the thread.
        self.executions = executions or {}
        self.process_max_items = process_max_items
        self.process_max_memory_mb = process_max_memory_mb
        self.process_stop_grace = process_stop_grace
        self.uses_children = "process" in self.executions.values()
        self.using = using
        self.slots = slots
        self.recorder = recorder
        self.on_output = on_output
        self.on_done = on_done
        self.stopping = stopping
        # Settings are fixed for a process's life: whether runs are traced is read
        # once here, not once a run.
        self.traced = tracing.enabled()
        # Claimed slots waiting for an executor (None: an executor's cue to
        # stop). A claim hands a whole batch over with one wake-up: a queue
        # waking an idle executor per item cost the dispatcher a sixth of its CPU.
        self._queued: collections.deque[Slot | None] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._idle = 0  # executors waiting in `take`
        self.executors: list[Executor] = []
        self._started = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the executors; returns once each can take a run (its child started), so
        the worker claims nothing that would wait out its timeout behind a starting child."""
        executors = [self._spawn() for _ in range(self.concurrency)]
        for executor in executors:
            executor.ready.wait(START_TIMEOUT)

    def new_child(self, name: str) -> Child | None:
        """A child process for an executor, if any type runs in `process` mode."""
        if not self.uses_children:
            return None
        return Child(
            name=f"{name}-child",
            using=self.using,
            max_items=self.process_max_items,
            max_memory_mb=self.process_max_memory_mb,
        )

    def _spawn(self) -> Executor:
        with self._lock:
            executor = Executor(self, self._started)
            self._started += 1
            self.executors.append(executor)
        executor.start()
        return executor

    def submit(self, slots: list[Slot]) -> None:
        """Queue claimed slots for the executors, in order."""
        self._put(slots)

    def _put(self, entries: Sequence[Slot | None]) -> None:
        with self._ready:
            self._queued.extend(entries)
            if self._idle:
                self._ready.notify(len(entries))

    def take(self) -> Slot | None:
        """The next queued slot (None: stop), waiting for one."""
        with self._ready:
            while not self._queued:
                self._idle += 1
                try:
                    self._ready.wait()
                finally:
                    self._idle -= 1
            return self._queued.popleft()

    def backlog(self) -> int:
        """Slots queued and not yet taken by an executor."""
        return len(self._queued)

    def runs_in_child(self, slot: Slot) -> bool:
        """Whether the slot's handler runs in a child process (which the worker can stop)."""
        return self.executions.get(slot.spec.work_type) == "process"

    def retire(self, executor: Executor, why: str) -> None:
        """Stop counting on an executor (stuck or dead) and start another in its place.

        An executor on a run in its child is not stuck: it stops the child itself
        (it sees its run abandoned) and carries on with a fresh one.
        """
        slot = executor.slot
        if executor.child is not None and (slot is None or self.runs_in_child(slot)):
            logger.info("%s stops its child process: %s", executor.name, why)
            return
        with self._lock:
            if executor.retired or executor not in self.executors:
                return
            executor.retired = True
            self.executors.remove(executor)
        logger.warning("replacing %s: %s", executor.name, why)
        self._spawn()
        # Its child sits idle while its thread is stuck in a thread-mode run, and a
        # stuck thread never closes it: Python's exit would wait for that child forever.
        idle_child, executor.child = executor.child, None
        if idle_child is not None:
            idle_child.close(self.process_stop_grace)

    def restarting(self) -> int:
        """Executors whose child is being stopped or replaced: a claim for them would wait."""
        if not self.uses_children:
            return 0
        return sum(
            1
            for executor in self.executors
            if executor.child is not None
            and (
                executor.child.replacing
                or (executor.slot is not None and executor.slot.state is SlotState.ABANDONED)
            )
        )

    def supervise(self) -> list[Slot]:
        """Replace executors that died; returns the runs they left behind (to hand back)."""
        orphans = []
        for executor in list(self.executors):
            if executor.is_alive():
                continue
            slot = executor.slot
            self.retire(executor, "its thread ended unexpectedly")
            if slot is not None and self.slots.transition(
                slot, SlotState.RUNNING, SlotState.ABANDONED
            ):
                slot.lose("its executor thread died")
                orphans.append(slot)
        return orphans

    def stop(self) -> None:
        with self._lock:
            executors = list(self.executors)
        self._put([None] * len(executors))
        # Executors with a child close it on their way out: wait for that (bounded),
        # so no child outlives the worker's shutdown.
        for executor in executors:
            if executor.child is not None:
                executor.join(2 * self.process_stop_grace + 1.0)

    def kill_children(self) -> int:
        """SIGKILL every child's process group (a forced exit); returns how many."""
        with self._lock:
            children = [e.child for e in self.executors if e.child is not None]
        for child in children:
            child.kill()
        return len(children)

    # --- one run ---------------------------------------------------------------------

    def execute(self, executor: Executor, slot: Slot) -> None:
        """Run a slot's handler and hand its outcome on; never raises."""
        if not self.slots.start(slot, executor):
            return  # abandoned while it waited (its lease was lost)
        if self.stopping():
            # Shutting down: hand unstarted work back at once.
            self.slots.transition(slot, SlotState.RUNNING, SlotState.FINISHED)
            self.recorder.hand_back(slot, "worker stopping before it started")
            self.on_done(slot)
            return
        self.check_connection(executor)
        context = WorkContext(slot.lease, slot.heartbeat, using=self.using)
        if slot.cancel_requested:  # asked to stop before it started: it never runs
            context.request_cancel()
        slot.context = context
        try:
            if context.cancelled:
                raise Cancelled(
                    f"work item {slot.lease.work_item_id!r} was cancelled before it ran"
                )
            if executor.child is not None and self.executions.get(slot.spec.work_type) == "process":
                answer = self._call_in_child(executor.child, slot, context)
                if answer.stopped is not None:
                    self._after_stop(executor, executor.child, slot, context, answer.stopped)
                    return
                if answer.error is not None:
                    if self.slots.transition(slot, SlotState.RUNNING, SlotState.FINISHED):
                        self._record_failure(slot, answer.error, answer.kind)
                    self._replace_child(executor, executor.child)
                    return
                output_json = answer.output_json
            else:
                try:
                    if self.traced:
                        output = tracing.run(self._call, slot, context)
                    else:
                        output = self._call(slot, context)
                finally:
                    # Before its outcome is written on this thread's connection.
                    left_open = end_handler_transactions(slot.lease)
                if left_open:
                    raise TransactionLeftOpen.on(left_open)
                output_json = validation.payload("handler output", output)
        except BaseException as exc:
            if self.slots.transition(slot, SlotState.RUNNING, SlotState.FINISHED):
                self._record_failure(slot, exc)
            return
        if self.slots.transition(slot, SlotState.RUNNING, SlotState.FINISHED):
            self.on_output(slot, output_json)
        # Otherwise the run was abandoned (it outlived its deadline or lost its
        # lease and was timed out): its ending is written already; drop the result.
        if executor.child is not None:
            self._replace_child(executor, executor.child)

    def _record_failure(self, slot: Slot, exc: BaseException, kind: str | None = None) -> None:
        try:
            self.recorder.failure(slot, exc, kind)
        except Exception:  # a bug of ours must not kill the executor or strand the lease
            logger.exception("recording the failure of %s failed", slot.lease.work_item_id)
            try:
                self.recorder.hand_back(slot, "its failure could not be recorded")
            except Exception:  # its lease runs out and the sweep takes it over
                logger.exception("handing back %s failed", slot.lease.work_item_id)
        finally:
            self.on_done(slot)

    def _call(self, slot: Slot, context: WorkContext) -> object:
        # Its lease is kept by the process's renewer, by its type's mode.
        return slot.spec.func(context)

    def _call_in_child(self, child: Child, slot: Slot, context: WorkContext) -> ChildAnswer:
        try:
            return child.run(slot, context, self.process_stop_grace)
        except ChildProcessDied as exc:  # it could not be started
            return ChildAnswer(error=exc)

    def _after_stop(
        self, executor: Executor, child: Child, slot: Slot, context: WorkContext, why: str
    ) -> None:
        """The worker stopped a run's child: end the run as its cause says, start a new child.

        Timed out or handed back (the slot is abandoned): its ending is written
        already. Lost lease: the item is its new holder's (or the sweep's);
        nothing to write. Cancelled: it ends cancelled, as a cooperative run would.
        """
        logger.warning(
            "stopped the child process running %s (token %d): %s",
            slot.lease.work_item_id,
            slot.lease.token,
            why,
        )
        if context.lease_lost and slot.fenced_out:
            if self.slots.transition(slot, SlotState.RUNNING, SlotState.FINISHED):
                self.recorder.counters.add(lost=1)
                self.on_done(slot)
        elif self.slots.transition(slot, SlotState.RUNNING, SlotState.FINISHED):
            self._record_failure(
                slot,
                Cancelled(
                    f"work item {slot.lease.work_item_id!r} was asked to stop and its child "
                    f"process was stopped ({why})"
                ),
            )
        self._replace_child(executor, child)

    def _replace_child(self, executor: Executor, child: Child) -> None:
        """Start a child in place of one that ended (stopped, recycled, died), if it did."""
        try:
            if child.replacing and not self.stopping():
                child.start()
        except ChildProcessDied as exc:  # the next run tries again, and fails if it cannot
            logger.error("%s: %s", executor.name, exc)

    def check_connection(self, executor: Executor) -> None:
        """Before a handler gets this thread's connection: drop it if the server did (also
        while the previous run held it: a run that starts after an outage runs normally)."""
        connection = executor.connection or connections[self.using]
        idle = time.monotonic() - executor.last_used > IDLE_CHECK_SECONDS
        refresh_connection(connection, executor.hang_up, idle)
