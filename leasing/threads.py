"""Daemon threads: one that does one thing every interval, one that acts on stop signals."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Self

from .sql.runner import close_connection

logger = logging.getLogger("leasing")


class IntervalThread:
    """Calls `tick()` every `interval` seconds until `stop()`, or until `tick()` returns True.

    A tick that raises, whatever it raises, is logged and the next tick comes at
    its time: the thread ends only by `stop()` or a True. An exception left to
    end it would end it silently (a `SystemExit` in a thread prints nothing),
    and a renewer that is gone lets every lease of its process run out while the
    process goes on claiming. A tick that keeps failing is logged at every interval.

    Django gives each thread its own connection; the thread closes its own when it ends.
    """

    def __init__(self, *, name: str, interval: float, using: str) -> None:
        self.interval = interval
        self.using = using
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> bool | None:
        raise NotImplementedError

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} can only be started once.")
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self, wait: bool = True, timeout: float = 5.0) -> None:
        self._stop.set()
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    if self.tick():
                        return
                except BaseException:
                    logger.exception("%s: a round failed; the next one comes as usual", self._name)
        finally:
            close_connection(self.using)


class SignalThread:
    """Acts on SIGTERM and SIGINT on a thread of its own, never inside the signal handler.

    Python runs a signal handler in the main thread between two bytecodes,
    possibly while that thread holds a lock: an `Event`'s (the worker's loop
    waits on one many times a second), logging's, a `join`'s. A handler that
    takes the same lock waits for itself forever, and the process never
    stops. So the handler only writes the signal's number to a pipe (no
    Python lock), and this thread reads it and calls `on_signal(signum)`.

    With `second_is_default`, the first signal puts the default actions back
    (from the handler, which only needs the C-level `signal.signal`), so a
    second one ends the process at once, as if nothing was installed.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, on_signal: Callable[[int], None], *, second_is_default: bool = False):
        self.on_signal = on_signal
        self.second_is_default = second_is_default
        self._previous: dict[int, Any] = {}
        self._write_fd: int | None = None

    def install(self) -> bool:
        """Installs the handlers; False (nothing installed) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if self._write_fd is not None:
            return True  # already installed
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # a full pipe drops a signal rather than block
        self._write_fd = write_fd
        threading.Thread(target=self._relay, args=(read_fd,), name="signals", daemon=True).start()
        self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        return True

    def restore(self) -> None:
        """Puts the previous handlers back and ends the thread (main thread only)."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if self._write_fd is not None:
            os.close(self._write_fd)  # the thread reads end-of-file and returns
            self._write_fd = None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.second_is_default:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if self._write_fd is not None:
            with contextlib.suppress(OSError):
                os.write(self._write_fd, bytes((signum,)))

    def _relay(self, read_fd: int) -> None:
        try:
            while data := os.read(read_fd, 64):
                for signum in data:
                    try:
                        self.on_signal(signum)
                    except Exception:
                        logger.exception("acting on signal %d failed", signum)
        finally:
            os.close(read_fd)
