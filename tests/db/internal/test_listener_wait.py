"""The listener's wait for NOTIFYs (`leasing.worker.listener`), on PostgreSQL.

psycopg's `notifies(timeout=...)` spins through the last millisecond of each
wait (it rounds the time left down to whole milliseconds); the listener waits
with `select` instead, and must still hear a NOTIFY that psycopg took off the
socket while a statement ran on the session.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg.connection
import pytest
from django.db import connection

from leasing.sql.new_items import NOTIFY_CHANNEL
from leasing.worker.leadership import Leadership
from leasing.worker.listener import NotifyListener, _Session, session_connection
from tests.support.helpers import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def resumes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts each time psycopg's notification reader is woken."""
    count = [0]
    real = psycopg.connection.notifies

    def counted(pgconn: Any) -> Iterator[Any]:
        gen = real(pgconn)
        sent = None
        try:
            while True:
                count[0] += 1
                sent = yield gen.send(sent)
        except StopIteration as stop:
            return stop.value

    monkeypatch.setattr(psycopg.connection, "notifies", counted)
    return count


def test_an_idle_leader_wakes_a_few_times_a_wait_not_hundreds(resumes: list[int]) -> None:
    woken: list[float] = []
    lead = Leadership("test-listener-wait", has_room=lambda: True)
    listener = NotifyListener("default", None, lambda: woken.append(1), lead).start()
    try:
        wait_for(lambda: lead.leading and listener._hears_enqueues, timeout=10)
        resumes[0] = 0
        time.sleep(0.5)  # at most one wait of IDLE_WAIT_S: a leader waits for news
        idle = resumes[0]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, "default"])
        wait_for(lambda: woken, timeout=5)
    finally:
        listener.stop()
    # Waiting with psycopg's timeout read the socket about a thousand times a wait.
    assert idle <= 10, f"{idle} reads of the socket in 0.5 s of quiet"


def test_a_notify_taken_off_the_socket_by_a_statement_is_still_heard() -> None:
    conn = session_connection("default")
    try:
        session = _Session(conn)
        session.execute(f"LISTEN {NOTIFY_CHANNEL}")
        assert session.heard(0) == []
        # The session's own NOTIFY reaches it with the statement's answer:
        # psycopg keeps it, and nothing is left on the socket to wake a select.
        session.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, "q"])
        notes = session.heard(2.0)
        assert [(n.channel, n.payload) for n in notes] == [(NOTIFY_CHANNEL, "q")]
        assert session.heard(0.05) == []
    finally:
        conn.close()


def test_a_notify_from_another_session_ends_the_wait() -> None:
    conn = session_connection("default")
    try:
        session = _Session(conn)
        session.execute(f"LISTEN {NOTIFY_CHANNEL}")
        session.heard(0)

        def notify() -> None:
            time.sleep(0.1)
            with session_connection("default") as other:
                other.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, "later"])

        sender = threading.Thread(target=notify)
        sender.start()
        started = time.monotonic()
        notes = session.heard(30.0)
        waited = time.monotonic() - started
        sender.join()
        assert [n.payload for n in notes] == ["later"]
        assert waited < 25.0  # woken by the NOTIFY, not by the end of the wait
    finally:
        conn.close()


def test_a_listener_whose_session_is_terminated_reconnects_and_hears_again() -> None:
    from leasing.sql.wakes import LISTENING

    def listener_pids() -> list[int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                f"AND {LISTENING}"
            )
            return [row[0] for row in cursor.fetchall()]

    woken: list[float] = []
    lead = Leadership("test-listener-reconnect", has_room=lambda: True)
    listener = NotifyListener("default", None, lambda: woken.append(1), lead).start()
    try:
        wait_for(lambda: lead.leading and listener._hears_enqueues and listener_pids(), timeout=10)
        (old,) = listener_pids()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [old])
        # Its wait ends on the closed socket; it reconnects and takes the lead again.
        wait_for(lambda: listener_pids() not in ([], [old]) and lead.leading, timeout=15)
        wait_for(lambda: listener._hears_enqueues, timeout=5)
        woken.clear()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, "default"])
        wait_for(lambda: woken, timeout=5)
    finally:
        listener.stop()


def test_a_nudge_ends_the_wait_at_once() -> None:
    import socket

    conn = session_connection("default")
    nudges, nudger = socket.socketpair()
    nudges.setblocking(False)
    try:
        session = _Session(conn, nudges)
        session.heard(0)
        sender = threading.Timer(0.1, lambda: nudger.send(b"\0\0"))
        sender.start()
        started = time.monotonic()
        assert session.heard(30.0) == []
        assert time.monotonic() - started < 25.0  # woken by the nudge
        # Both bytes were read: the next wait is not cut short by the same nudge.
        started = time.monotonic()
        assert session.heard(0.2) == []
        assert time.monotonic() - started >= 0.15
    finally:
        nudges.close()
        nudger.close()
        conn.close()


def test_a_nudged_leader_steps_down_after_a_claim_that_filled_up() -> None:
    lead = Leadership("test-listener-nudge", has_room=lambda: True)
    listener = NotifyListener("default", None, lambda: None, lead).start()
    try:
        wait_for(lambda: lead.leading and listener._hears_enqueues, timeout=10)
        # Its wait is IDLE_WAIT_S long, and nothing else happens meanwhile: only
        # the nudge from `claimed` has it step down (and UNLISTEN) well before.
        lead.claimed(5, 5, time.monotonic())
        wait_for(lambda: not lead.leading and listener._hears_enqueues is False, timeout=0.8)
    finally:
        started = time.monotonic()
        listener.stop(timeout=5.0)
        stopped_in = time.monotonic() - started
    assert not listener._thread.is_alive()
    assert stopped_in < 0.8  # stopping nudges too, rather than waiting out IDLE_WAIT_S
