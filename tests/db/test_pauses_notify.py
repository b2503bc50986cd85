"""Resuming wakes idle workers: a NOTIFY on the enqueue channel for each queue that
holds claimable items of what was resumed (PostgreSQL); SQLite has no NOTIFY."""

from __future__ import annotations

import pytest

import leasing
from leasing import LeaseManager, enqueue

pytestmark = pytest.mark.django_db(transaction=True)


def _listening():
    """A psycopg connection of its own, LISTENing to the enqueue channel."""
    import psycopg

    from leasing.sql.new_items import NOTIFY_CHANNEL
    from tests.support.helpers import database_url

    listener = psycopg.connect(database_url(), autocommit=True)
    listener.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
    return listener


def _heard(listener) -> list[str]:
    return sorted(n.payload for n in listener.notifies(timeout=0.5))


@pytest.mark.postgres
def test_resuming_a_work_type_wakes_each_queue_holding_its_claimable_items():
    enqueue("a1", "test.echo", queue_name="a")
    enqueue("a2", "test.echo", queue_name="a")
    enqueue("b1", "test.echo", queue_name="b")
    enqueue("c1", "test.noop", queue_name="c")  # another type's queue: not woken
    parent = enqueue("d0", "test.noop", queue_name="c")
    enqueue("d1", "test.echo", queue_name="d", depends_on=[parent])  # blocked: not claimable
    leasing.pause(work_type="test.echo", by="ops", reason="bad deploy")
    with _listening() as listener:
        state = leasing.resume(work_type="test.echo", by="ops", reason="fixed")
        heard = _heard(listener)
    assert state.changed and not state.paused
    assert heard == ["a", "b"]


@pytest.mark.postgres
def test_resuming_a_queue_still_wakes_that_queue_and_a_resume_that_changed_nothing_wakes_none():
    enqueue("e1", "test.echo", queue_name="emails")
    leasing.pause(queue="emails", by="ops", reason="outage")
    with _listening() as listener:
        leasing.resume(queue="emails", by="ops", reason="back")
        assert _heard(listener) == ["emails"]
        assert not leasing.resume(work_type="test.echo", by="ops", reason="again").changed
        assert _heard(listener) == []


def test_a_resumed_work_type_is_claimable_again_on_every_database():
    enqueue("a1", "test.echo", queue_name="a")
    leasing.pause(work_type="test.echo", by="ops", reason="bad deploy")
    assert LeaseManager("w").acquire_lease() is None
    state = leasing.resume(work_type="test.echo", by="ops", reason="fixed")
    assert state.changed and not state.paused
    lease = LeaseManager("w").acquire_lease()
    assert lease is not None and lease.queue_name == "a"
