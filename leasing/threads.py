"""A daemon thread that does one thing every interval, with a database connection of its own."""

from __future__ import annotations

import threading
from typing import Self

from .sql.runner import close_connection


class IntervalThread:
    """Calls `tick()` every `interval` seconds until `stop()`, or until `tick()` returns True.

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
                if self.tick():
                    return
        finally:
            close_connection(self.using)
