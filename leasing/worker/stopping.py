"""SIGTERM and SIGINT for a worker process: the first stops it gracefully, a second at once.

A second signal (Ctrl-C pressed twice) still gives the running items up:
`on_forced` hands their leases back in one short statement (bounded by a
`statement_timeout` of `FORCED_STATEMENT_TIMEOUT` on PostgreSQL), on a thread
of its own with a connection of its own (the main thread may be inside a
statement of its own), waited for at most `FORCED_STOP_SECONDS`; then
`on_exit` kills the process groups of the worker's child processes (process
mode: the processes their handlers started are in them), and the process exits.
If the database does not answer in time, it exits all the same and says so:
those leases wait for their expiry and the sweep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable

from ..threads import SignalThread

logger = logging.getLogger("leasing.worker")


# How long a forced stop waits for its hand-back before it exits anyway.
FORCED_STOP_SECONDS = 1.5
# The hand-back statement's own bound on PostgreSQL (`statement_timeout`, seconds).
FORCED_STATEMENT_TIMEOUT = 1.0
# The exit status of a forced stop.
FORCED_EXIT_CODE = 1


class ShutdownSignals:
    """Installs the handlers (main thread only) and restores the previous ones.

    The stop is acted on by `SignalThread`'s thread, not inside the handler:
    the worker's main thread holds its wake-up event's lock many times a
    second, and a handler that set that event would wait for itself.
    """

    def __init__(
        self,
        on_first: Callable[[str], None],
        on_forced: Callable[[], int] | None = None,
        on_exit: Callable[[], object] | None = None,
    ) -> None:
        self.on_first = on_first
        # Hands the running items back; returns how many.
        self.on_forced = on_forced
        # Called last before the process ends: kills what would outlive it (the
        # process groups of its children, whose parent-death signal reaches only the
        # child itself, not the processes its handler started).
        self.on_exit = on_exit
        self.received = 0
        self._thread = SignalThread(self._handle)

    def install(self) -> None:
        if not self._thread.install():
            logger.debug("not in the main thread: signal handlers not installed")

    def restore(self) -> None:
        self._thread.restore()

    def _handle(self, signum: int) -> None:
        self.received += 1
        name = signal.Signals(signum).name
        if self.received > 1:
            logger.warning("second signal (%s): handing running items back, then exiting", name)
            self.force_stop()
        self.on_first(name)

    def force_stop(self) -> None:
        """Hand the running items back (bounded), then end the process at once."""
        outcome: list[int | BaseException] = []

        def hand_back() -> None:
            try:
                outcome.append(self.on_forced() if self.on_forced is not None else 0)
            except BaseException as exc:  # reported below; the process exits either way
                outcome.append(exc)

        thread = threading.Thread(target=hand_back, name="forced-stop", daemon=True)
        thread.start()
        thread.join(FORCED_STOP_SECONDS)
        if outcome and isinstance(outcome[0], int):
            logger.warning("handed back %d running item(s); exiting", outcome[0])
        else:
            why = (
                f"the database failed it ({outcome[0]})"
                if outcome
                else "the database did not answer"
            )
            logger.error(
                "could not hand the running items back (%s): their leases run out and the "
                "sweep re-queues them; exiting",
                why,
            )
        if self.on_exit is not None:
            try:
                self.on_exit()
            except Exception:  # the process exits either way
                logger.exception("stopping the child processes failed")
        for handler in logging.getLogger().handlers + logging.getLogger("leasing").handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(FORCED_EXIT_CODE)
