"""SIGTERM and SIGINT for a worker process: the first stops it gracefully, a second at once."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

logger = logging.getLogger("leasing.worker")


class ShutdownSignals:
    """Installs the handlers (main thread only) and restores the previous ones."""

    def __init__(self, on_first: Callable[[str], None]) -> None:
        self.on_first = on_first
        self.received = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not in the main thread: signal handlers not installed")
            return
        self._previous = {
            signum: signal.signal(signum, self._handle)
            for signum in (signal.SIGTERM, signal.SIGINT)
        }

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        name = signal.Signals(signum).name
        if self.received > 1:
            logger.warning("second signal (%s): exiting at once", name)
            os._exit(1)
        self.on_first(name)
