"""The worker's side of process execution: one child process per executor.

Python cannot stop a thread, but it can stop a process. An executor whose
run's type is in `process` mode sends the run to its child and waits for
the answer, watching the run meanwhile: when the run is timed out or handed
back (its slot abandoned), loses its lease (force-released, recovered), or
was asked to stop and has not within `PROCESS_STOP_GRACE`, the child gets
SIGTERM, then SIGKILL after the same grace, and a fresh child takes its
place. A stopped run is therefore never left running.

Children are started with multiprocessing's "spawn" context: a fresh
interpreter. `fork` of a worker copies a process with threads (the
renewer, the listener, other executors) in whatever state they are in,
locks held included (logging's, the database driver's), and the copy can
deadlock on them; "forkserver" would be safe too, but would make the
children grandchildren of a server process, where the worker's death
cannot reach them by a parent-death signal. A child is replaced after
`PROCESS_MAX_ITEMS` items or when it uses more than `PROCESS_MAX_MEMORY_MB`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from django.db import connections

from .. import tracing
from . import child
from .slots import SlotState

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from ..context import WorkContext
    from .slots import Slot

logger = logging.getLogger("leasing.worker")

# The most a child may take to start (a fresh interpreter setting Django up).
START_TIMEOUT = 120.0
# How often a waiting executor looks at its run (timed out, lost, asked to stop).
WATCH_SECONDS = 0.05
# The longest one `process.join()` waits: multiprocessing waits in milliseconds in a C int,
# so a longer timeout (a PROCESS_STOP_GRACE of weeks) raises OverflowError in the executor.
MAX_JOIN_SECONDS = 2**31 // 1000 - 1


def _join_timeout(seconds: float) -> float:
    return min(seconds, MAX_JOIN_SECONDS)


class ChildProcessDied(RuntimeError):
    """The child running a handler ended without an answer (killed from outside, out of
    memory, a crash in native code, `os._exit`): a failure of the attempt, retried by its
    retries like any other."""


@dataclass(frozen=True, slots=True)
class ChildAnswer:
    """How a run in a child ended: `output_json` (returned), `error` (raised), or
    `stopped` (the worker stopped the child; why is `reason`)."""

    output_json: str | None = None
    error: BaseException | None = None
    # How the child classified `error` (`outcomes.classify`): the chain that says
    # "the database went away" does not survive pickling.
    kind: str | None = None
    stopped: str | None = None


class Child:
    """One child process and the pipe to it; used by one executor thread only."""

    def __init__(self, *, name: str, using: str, max_items: int, max_memory_mb: int) -> None:
        self.name = name
        self.using = using
        self.max_items = max_items
        self.max_memory_bytes = max_memory_mb * 1024 * 1024
        self.process: BaseProcess | None = None
        self.conn: Connection | None = None
        self.items = 0  # runs of the current child
        # Its process ended (stopped, recycled, died) and no new one has started yet:
        # the worker claims nothing for it meanwhile.
        self.replacing = False
        # Its process group (its pid), which it leads once started: stopping the
        # child signals the group, the processes its handler started included.
        self.group: int | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        """Start a fresh child and wait until it is ready (raises ChildProcessDied if not)."""
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe(duplex=True)
        database = dict(connections[self.using].settings_dict)
        process = context.Process(
            target=child.main,
            args=(theirs, database, self.using, os.getpid()),
            name=self.name,
            # Not daemonic: a handler may start processes of its own. The
            # worker stops its children itself (`close`), and a parent-death
            # signal ends them if the worker dies.
            daemon=False,
        )
        process.start()
        theirs.close()
        self.process, self.conn, self.items, self.group = process, ours, 0, None
        try:
            self._handshake(process, ours)
        finally:
            self.replacing = False  # started, or failed: a run may try (and fail) again
        # It made its own process group before it answered (`child.main`).
        with contextlib.suppress(OSError):
            if process.pid is not None and os.getpgid(process.pid) == process.pid:
                self.group = process.pid

    def _handshake(self, process: BaseProcess, ours: Connection) -> None:
        if not ours.poll(START_TIMEOUT):
            self.stop(0.0)
            raise ChildProcessDied(f"{self.name} did not start within {START_TIMEOUT:g}s")
        try:
            ours.recv()  # ("ready", pid)
        except (EOFError, OSError):
            code = process.exitcode
            self.stop(0.0)
            raise ChildProcessDied(
                f"{self.name} exited while starting (exit code {code}); see its output"
            ) from None
        logger.debug("%s started (pid %s)", self.name, process.pid)

    def run(self, slot: Slot, context: WorkContext, grace: float) -> ChildAnswer:
        """Run the slot's handler in the child and wait for its answer, stopping the child
        when the run must stop. Starts a child first if there is none."""
        if not self.alive():
            self.start()
        conn = self.conn
        assert conn is not None
        received = tracing.received_ns(slot.claimed_at)  # the child's claim span ends there
        conn.send(("run", slot.spec.work_type, slot.spec.dotted_path, slot.lease, received))
        self.items += 1
        asked_at: float | None = None  # when the child was told the item should stop
        while True:
            try:
                ready = conn.poll(WATCH_SECONDS)
                message = conn.recv() if ready else None
            except (EOFError, OSError):
                return self._died()
            if message is not None:
                if message[0] == "span":
                    tracing.child_run_started(slot.lease, message[1:])
                elif message[0] != "beat":
                    return self._answer(message)
                else:
                    slot.heartbeat.beat()  # and look at the run, however often it beats
            if slot.state is SlotState.ABANDONED:  # timed out, or handed back at shutdown
                self.stop(grace)
                return ChildAnswer(stopped="its run was ended by the worker")
            if context.lease_lost and slot.fenced_out:
                # Only a lease that moved on: one that merely expired is still the run's,
                # and its deadline (the worker's timeout) ends it as the policy says.
                self.stop(grace)
                return ChildAnswer(stopped=f"its lease was lost ({context.lease_lost_reason})")
            if context.cancelled:
                if asked_at is None:
                    asked_at = time.monotonic()
                    conn.send(("cancel", slot.key))
                elif time.monotonic() - asked_at > grace:
                    self.stop(grace)
                    return ChildAnswer(stopped=f"it was cancelled and did not stop in {grace:g}s")
            if not self.alive() and not conn.poll():
                return self._died()

    def _answer(self, message: tuple[Any, ...]) -> ChildAnswer:
        kind, rss = message[0], message[-1]
        if rss > self.max_memory_bytes or self.items >= self.max_items:
            why = (
                f"{rss // (1024 * 1024)} MiB resident"
                if rss > self.max_memory_bytes
                else f"{self.items} items run"
            )
            logger.info("replacing %s (pid %s): %s", self.name, self.pid, why)
            self.close(grace=5.0)
        if kind == "done":
            return ChildAnswer(output_json=message[1])
        _, category, data, text, _ = message
        error: BaseException
        try:
            error = pickle.loads(data) if data is not None else ChildProcessDied(text)
        except Exception:
            error = ChildProcessDied(text)
        error.__cause__ = child.RemoteTraceback(text)
        return ChildAnswer(error=error, kind=category)

    def _died(self) -> ChildAnswer:
        code = None
        if self.process is not None:
            self.process.join(1.0)
            code = self.process.exitcode
        self._kill_group()  # its run has ended: so do the processes its handler started
        self._forget()
        if code == child.TERMINATED_EXIT_CODE:
            # SIGTERM the worker did not send (it stops children only after it ended
            # their run): a service manager stopping the whole group, say. Not the
            # handler's fault: handed back without counting an attempt (a bounded
            # number of times in a row, as for any interruption).
            return ChildAnswer(
                error=ChildProcessDied("the child process running the handler got SIGTERM"),
                kind="interrupted",
            )
        why = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
        return ChildAnswer(
            error=ChildProcessDied(f"the child process running the handler ended ({why})")
        )

    def stop(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; returns once the child is gone.

        Its whole process group is signalled: processes the handler started get the
        SIGTERM with it, and whatever is left of them is killed once it has ended,
        so a stopped run leaves nothing running.
        """
        process = self.process
        if process is not None and process.is_alive():
            self._signal(process, signal.SIGTERM)
            process.join(_join_timeout(grace))
            if process.is_alive():
                logger.warning(
                    "%s (pid %s) ignored SIGTERM for %gs: killing it", self.name, process.pid, grace
                )
                self._signal(process, signal.SIGKILL)
                process.join(5.0)
            self._kill_group()
        self._forget()

    def _signal(self, process: BaseProcess, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.group is not None:
                os.killpg(self.group, signum)
            elif process.pid is not None:  # not started yet: its handler started nothing
                os.kill(process.pid, signum)

    def kill(self) -> None:
        """SIGKILL the child and its whole process group at once (any thread: a forced
        exit, which must not leave the handler's processes behind)."""
        process, group = self.process, self.group
        with contextlib.suppress(OSError):
            if group is not None:
                os.killpg(group, signal.SIGKILL)
            elif process is not None and process.pid is not None:
                os.kill(process.pid, signal.SIGKILL)

    def _kill_group(self) -> None:
        """SIGKILL what is left of the child's process group (its handler's processes)."""
        if self.group is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.group, signal.SIGKILL)

    def close(self, grace: float) -> None:
        """Ask an idle child to exit; stop it if it does not."""
        if self.process is not None and self.conn is not None and self.process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self.conn.send(None)
            self.process.join(_join_timeout(grace))
        self.stop(grace)

    def _forget(self) -> None:
        # The process object is not closed: multiprocessing's exit handler may be
        # reading it from another thread; it drops it once it has ended.
        if self.conn is not None:
            self.conn.close()
        if self.process is not None:
            self.replacing = True
        self.process = self.conn = None
        self.group = None
