"""Lease lifecycle signals: sent after commit, once per lease event, to any receiver."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import transaction

from leasing import LeaseManager, RecoverySweep, enqueue, signals
from leasing.models import WorkItem
from leasing.services.operations import Action, apply_action
from leasing.worker import WorkerOptions, WorkerRuntime
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db(transaction=True)

ALL = (
    "lease_acquired",
    "lease_renewed",
    "heartbeat",
    "lease_released",
    "lease_expired",
    "lease_force_released",
)


@pytest.fixture
def received():
    events: dict[str, list[dict]] = defaultdict(list)
    receivers = {}
    for name in ALL:

        def receiver(sender, signal, name=name, **kwargs):
            events[name].append(kwargs)

        receivers[name] = receiver
        getattr(signals, name).connect(receiver, weak=False)
    yield events
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def test_a_worker_sends_acquired_heartbeat_and_released(received, leasing_settings):
    leasing_settings(RETRY_BACKOFF_BASE=0.01)
    ok = enqueue("ok", "test.echo", {"n": 1})
    beating = enqueue("beating", "test.beat_sleep", {"seconds": 0.3, "every": 0.05})
    failing = enqueue("failing", "test.always_fail", max_retries=1)
    WorkerRuntime(WorkerOptions(concurrency=2, burst=True, poll_interval=0.05)).run()

    acquired = [(e["work_item_id"], e["token"]) for e in received["lease_acquired"]]
    assert sorted(acquired) == sorted(
        [(ok.pk, 1), (beating.pk, 1), (failing.pk, 1), (failing.pk, 2)]
    )
    assert all(e["lease"].work_item_id == e["work_item_id"] for e in received["lease_acquired"])
    released = {(e["work_item_id"], e["token"]): e["status"] for e in received["lease_released"]}
    assert released == {
        (ok.pk, 1): "completed",
        (beating.pk, 1): "completed",
        (failing.pk, 1): "pending",  # retried
        (failing.pk, 2): "failed",
    }
    assert {e["work_item_id"] for e in received["heartbeat"]} == {beating.pk}


def test_signals_wait_for_the_commit(received, make_items):
    [item] = make_items(1)
    manager = LeaseManager("w")
    with transaction.atomic():
        manager.acquire_lease()
        assert received["lease_acquired"] == []  # not yet: it could still roll back
    assert [e["work_item_id"] for e in received["lease_acquired"]] == [item.pk]
    with transaction.atomic():
        manager.renew_lease(item.pk, 60)
        transaction.set_rollback(True)
    assert received["lease_renewed"] == []  # rolled back: never happened
    manager.renew_lease(item.pk, 60)
    assert [e["expires_at"] is not None for e in received["lease_renewed"]] == [True]


def test_the_sweep_and_operators_send_theirs(received, make_items):
    expired, held = make_items(2, max_retries=0)
    LeaseManager("dead").acquire_leases(2, lease_duration_seconds=60)
    WorkItem.objects.filter(pk=expired.pk).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )
    RecoverySweep().scan_and_recover()
    [event] = received["lease_expired"]
    assert (event["work_item_id"], event["token"], event["worker_id"]) == (expired.pk, 1, "dead")
    assert (event["status"], event["timed_out"]) == ("failed", False)

    result = apply_action(
        Action.FORCE_RELEASE, held.pk, expected_token=1, actor="ops", reason="stuck"
    )
    assert result.applied
    [event] = received["lease_force_released"]
    assert (event["work_item_id"], event["worker_id"], event["actor"]) == (held.pk, "dead", "ops")


def test_a_failing_receiver_never_reaches_the_worker(make_items):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    signals.lease_acquired.connect(broken, weak=False)
    try:
        make_items(1)
        assert LeaseManager("w").acquire_lease() is not None
    finally:
        signals.lease_acquired.disconnect(broken)
