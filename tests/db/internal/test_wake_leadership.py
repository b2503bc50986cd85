"""One idle worker answers each wake (`leasing.worker.leadership`): real `runworker`
processes on PostgreSQL.

The workers poll every 30 s here, so an item that starts within a second was
started by a wake (or by a worker taking over the lead), never by a poll.
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_the_claim_key_is_the_same_for_the_same_filters_in_any_order():
    from leasing.sql.terms import ClaimFilters
    from leasing.worker.leadership import claim_key

    one = ClaimFilters(work_types=("a", "b"), queues=("q1", "q2"))
    same = ClaimFilters(work_types=("b", "a"), queues=("q2", "q1"))
    assert claim_key(one) == claim_key(same)
    assert claim_key(one) != claim_key(ClaimFilters(work_types=("a", "b"), queues=("q1",)))
    assert claim_key(one) != claim_key(ClaimFilters(work_types=("a",), queues=("q1", "q2")))
    assert claim_key(ClaimFilters()) != claim_key(one)


def test_only_the_leader_hears_enqueues_and_a_freed_lead_is_taken_and_claimed_for():
    import threading

    from django.db import connection

    from leasing.sql import wakes
    from leasing.sql.new_items import NOTIFY_CHANNEL
    from leasing.worker.leadership import LEAD_RETRY_S, Leadership
    from leasing.worker.listener import NotifyListener
    from tests.support.helpers import wait_for

    woken = threading.Event()
    calls: list[float] = []

    def on_notify() -> None:
        calls.append(time.monotonic())
        woken.set()

    lead = Leadership("test-key", has_room=lambda: True)
    lock_sql, lock_params = wakes.try_lead(lead.key)
    with connection.cursor() as cursor:  # this session holds the lead
        cursor.execute(lock_sql, lock_params)
        assert cursor.fetchone()[0] is True
    listener = NotifyListener("default", None, on_notify, lead).start()
    try:
        time.sleep(2 * LEAD_RETRY_S)  # it tried for the lead at least once, and failed
        assert not lead.leading and not listener._hears_enqueues
        with connection.cursor() as cursor:
            for _ in range(5):
                cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, "default"])
        time.sleep(0.3)
        assert calls == []  # not the leader: not woken for enqueues at all
        with connection.cursor() as cursor:
            cursor.execute(*wakes.step_down(lead.key))
        # Within a try's interval it takes the lead and claims (wakes may have gone unheard).
        assert woken.wait(timeout=3 * LEAD_RETRY_S)
        wait_for(lambda: listener._hears_enqueues, timeout=2)
        assert lead.leading
        woken.clear()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, "default"])
        assert woken.wait(timeout=2)  # the leader is woken by an enqueue
    finally:
        listener.stop()


def test_a_trickling_leader_listens_again_once_its_claims_get_fewer_than_two_items():
    from leasing.worker.leadership import TRICKLE_POLL_S, Leadership
    from leasing.worker.listener import session_connection

    with session_connection("default") as conn:
        lead = Leadership("test-trickle", has_room=lambda: True)
        nudges: list[int] = []
        lead.nudge = lambda: nudges.append(1)
        assert lead.tick(conn)  # nobody leads: it takes the lead, and claims
        assert lead.leading and lead.listens
        assert lead.trickle_due_in() == float("inf")  # claims follow wakes, not a timer
        lead.claimed(10, 3, time.monotonic())
        assert lead.woken(conn) and lead.woken(conn)  # two wakes at once: dense
        assert lead.trickle and not lead.listens
        # The dispatcher times the trickle's claims from its last one; the listener
        # does not claim on a timer of its own.
        lead.claimed(10, 2, time.monotonic())  # two wakes' items in one claim
        assert 0 < lead.trickle_due_in() <= TRICKLE_POLL_S
        time.sleep(TRICKLE_POLL_S)
        assert lead.trickle_due_in() <= 0
        assert not lead.tick(conn) and lead.trickle and nudges == []
        lead.claimed(10, 1, time.monotonic())  # enqueues come slower than its claims
        assert nudges == [1]  # the listener is told at once
        assert lead.tick(conn)  # one more claim, after listening again
        assert lead.listens and not lead.trickle
        assert lead.trickle_due_in() == float("inf")


def test_the_listener_is_nudged_when_claims_fill_up_or_a_trickle_has_no_room():
    from leasing.worker.leadership import FILLED_FOR_S, Leadership
    from leasing.worker.listener import session_connection

    room = [True]
    with session_connection("default") as conn:
        lead = Leadership("test-nudges", has_room=lambda: room[0])
        nudges: list[int] = []
        lead.nudge = lambda: nudges.append(1)
        assert lead.tick(conn)
        lead.claimed(10, 4, time.monotonic())
        assert nudges == []  # nothing for the listener to do
        lead.claimed(10, 10, time.monotonic())  # it took all it asked for
        assert nudges == [1]  # the listener waits FILLED_FOR_S from now, not IDLE_WAIT_S
        assert 0 < lead.wait_s(1.0) <= FILLED_FOR_S
        assert not lead.tick(conn) and lead.leading  # a claim with room may follow at once
        lead.claimed(10, 3, time.monotonic())  # and did: nothing was left
        time.sleep(FILLED_FOR_S)
        assert not lead.tick(conn) and lead.leading
        lead.claimed(10, 10, time.monotonic())
        lead.claimed(10, 10, time.monotonic())  # filling up again and again
        assert nudges == [1, 1]
        time.sleep(FILLED_FOR_S)
        assert not lead.tick(conn) and not lead.leading  # it stepped down
        lead.claimed(10, 10, time.monotonic())
        assert nudges == [1, 1]  # not leading: nothing to tell
        time.sleep(0.6)  # its next try for the lead (LEAD_RETRY_S)
        assert lead.tick(conn) and lead.leading
        lead.claimed(10, 3, time.monotonic())
        assert lead.woken(conn) and lead.woken(conn) and lead.trickle
        room[0] = False
        lead.claimed(0, 0, time.monotonic())  # the trickle's claim found no room
        assert nudges == [1, 1, 1]
        assert not lead.tick(conn) and not lead.leading and not lead.trickle
