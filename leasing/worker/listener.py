"""PostgreSQL LISTEN/NOTIFY: wake idle workers when work is enqueued or re-queued.

The listener holds a session connection of its own (LISTEN needs a session,
so behind a transaction pooler `LEASING["LISTEN_DATABASE"]` names a direct
connection, or `LEASING["LISTEN"] = False` makes workers poll). Polling with
jitter stays the fallback whenever the listener is down. With `leadership`
one idle worker of a claim key answers each wake, not all of them, and only
that one LISTENs, and only while wakes are worth hearing
(`leasing.worker.leadership`).
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from ..sql import wakes
from ..sql.new_items import NOTIFY_CHANNEL
from .leadership import Leadership

logger = logging.getLogger("leasing.worker")

# The longest wait for a NOTIFY: stopping and the dispatcher's news end a wait
# at once (`nudge`), and a worker that does not lead waits only until its next
# try for the lead; each wake-up costs CPU on a busy host.
IDLE_WAIT_S = 1.0


class NotifyListener:
    """A daemon thread calling `on_notify()` for each NOTIFY about one of `queues` that this
    worker answers (all of them without `leadership`)."""

    def __init__(
        self,
        using: str,
        queues: tuple[str, ...] | None,
        on_notify: Callable[[], None],
        leadership: Leadership | None = None,
    ) -> None:
        self.using = using
        self.queues = set(queues) if queues else None
        self.on_notify = on_notify
        self.leadership = leadership
        self._stop = threading.Event()
        # Another thread's nudge ends the listener's wait at once: a byte on this pair.
        self._nudges, self._nudger = socket.socketpair()
        self._nudges.setblocking(False)
        self._nudger.setblocking(False)
        if leadership is not None:
            leadership.nudge = self.nudge
        # LISTENing on the enqueue channel (listener thread only); None: not said yet.
        self._hears_enqueues: bool | None = None
        self._thread = threading.Thread(target=self._run, name="notify-listener", daemon=True)

    def start(self) -> NotifyListener:
        self._thread.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        self.nudge()
        self._thread.join(timeout)

    def nudge(self) -> None:
        """End the listener's current wait (any thread)."""
        # Full (a nudge is pending already), or closed (it stopped): nothing to do.
        with contextlib.suppress(OSError):
            self._nudger.send(b"\0")

    def _run(self) -> None:
        # psycopg is only installed where PostgreSQL is used, and only then does this run.
        import psycopg

        failing = False  # a streak of failed sessions: said once, at WARNING
        while not self._stop.is_set():
            try:
                with session_connection(self.using) as conn:
                    if failing:
                        logger.info("notify listener connected again: wake-ups are back")
                        failing = False
                    # The session's first statement says what it is, LISTEN or UNLISTEN:
                    # monitoring (and the bench) count listener sessions by their mark,
                    # and a worker full from its first claim may not run another for long.
                    self._hears_enqueues = None
                    self._follow_lead(conn)
                    self._listen(conn)
            except psycopg.Error as exc:
                if not failing:
                    logger.warning(
                        "notify listener on database %r failed (%s): idle workers poll "
                        "until it connects again (tried every second)",
                        self.using,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc),
                    )
                    failing = True
                else:
                    logger.debug("notify listener reconnecting: %s", exc)
                self._stop.wait(1.0)
            finally:
                if self.leadership is not None:
                    self.leadership.disconnected()
        self._nudges.close()
        self._nudger.close()

    def _listen(self, conn: Any) -> None:
        lead = self.leadership
        session = _Session(conn, self._nudges)
        while not self._stop.is_set():
            # One NOTIFY at a time: the leadership's statements run on this
            # connection between waits, never inside one.
            wait_s = lead.wait_s(IDLE_WAIT_S) if lead is not None else IDLE_WAIT_S
            notes = session.heard(wait_s)
            # A list, not a generator: every NOTIFY is read, whatever the first says.
            claim = any([self._answers(session, note.channel, note.payload) for note in notes])
            if lead is not None and lead.tick(session):
                claim = True
            self._follow_lead(session)
            if claim:
                self.on_notify()

    def _follow_lead(self, conn: Any) -> None:
        """LISTEN on the enqueue channel while this worker answers wakes (there is no
        leadership, or it leads and wakes are sparse), UNLISTEN otherwise: a session
        that listens reads every NOTIFY of the database, in a transaction."""
        wanted = self.leadership is None or self.leadership.listens
        if wanted != self._hears_enqueues:
            conn.execute(wakes.listen(NOTIFY_CHANNEL, wanted))
            self._hears_enqueues = wanted

    def _answers(self, conn: Any, channel: str, payload: str) -> bool:
        if channel != NOTIFY_CHANNEL:
            return False
        if self.queues is not None and payload not in self.queues:
            return False
        lead = self.leadership
        return lead is None or lead.woken(conn)


def session_connection(using: str) -> Any:
    """A psycopg connection of its own to the database of `using`, in autocommit
    (LISTEN needs a session, and Django's connection belongs to another thread)."""
    import psycopg

    params = connections[using].get_connection_params()
    for django_only in ("cursor_factory", "context", "server_side_binding"):
        params.pop(django_only, None)
    return psycopg.connect(**params, autocommit=True)


class _Session:
    """The listener's connection: waits for NOTIFYs without spinning.

    psycopg's own wait with a timeout (`notifies(timeout=...)`) rounds the time
    left down to whole milliseconds, so for the last millisecond of every wait
    it polls with a zero timeout, hundreds of times. Here `select` waits (its
    timeout is a float) and psycopg only reads what arrived. A NOTIFY that
    arrives while a statement runs on the session is kept by psycopg rather
    than left on the socket, so after a statement that backlog is read first.
    """

    def __init__(self, conn: Any, nudges: socket.socket | None = None) -> None:
        self.conn = conn
        self.nudges = nudges  # readable when another thread wants the wait to end
        self._spoke = True  # a statement ran since notifications were last read

    def execute(self, *args: Any) -> Any:
        self._spoke = True
        return self.conn.execute(*args)

    def heard(self, wait_s: float) -> list[Any]:
        """The notifications that arrived, waiting up to `wait_s` for one."""
        conn = self.conn
        if self._spoke:
            self._spoke = False
            notes = list(conn.notifies(timeout=0, stop_after=1))
            if notes:
                return notes
        if wait_s <= 0:
            return list(conn.notifies(timeout=0, stop_after=1))
        watched: list[Any] = [conn.fileno()]
        if self.nudges is not None:
            watched.append(self.nudges)
        ready = select.select(watched, [], [], wait_s)[0]
        if self.nudges is not None and self.nudges in ready:
            _drain(self.nudges)
        if conn.fileno() not in ready:
            return []
        return list(conn.notifies(timeout=0, stop_after=1))


def _drain(nudges: socket.socket) -> None:
    """Read every pending nudge (one wake answers them all)."""
    with contextlib.suppress(BlockingIOError):
        while nudges.recv(64):
            pass
