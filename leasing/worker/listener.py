"""PostgreSQL LISTEN/NOTIFY: wake idle workers when work is enqueued or re-queued.

The listener holds a session connection of its own (LISTEN needs a session,
so behind a transaction pooler `LEASING["LISTEN_DATABASE"]` names a direct
connection, or `LEASING["LISTEN"] = False` makes workers poll). Polling with
jitter stays the fallback whenever the listener is down.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

from ..sql.new_items import NOTIFY_CHANNEL

logger = logging.getLogger("leasing.worker")


class NotifyListener:
    """A daemon thread calling `on_notify()` for each NOTIFY about one of `queues`."""

    def __init__(
        self, using: str, queues: tuple[str, ...] | None, on_notify: Callable[[], None]
    ) -> None:
        self.using = using
        self.queues = set(queues) if queues else None
        self.on_notify = on_notify
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notify-listener", daemon=True)

    def start(self) -> NotifyListener:
        self._thread.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        # psycopg is only installed where PostgreSQL is used, and only then does this run.
        import psycopg
        from psycopg import sql

        params = connections[self.using].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.pop("server_side_binding", None)
        while not self._stop.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.25):
                            if self.queues is None or note.payload in self.queues:
                                self.on_notify()
            except psycopg.Error as exc:
                logger.debug("notify listener reconnecting: %s", exc)
                self._stop.wait(1.0)
