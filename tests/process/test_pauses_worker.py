"""A pause stops real worker processes claiming a queue at their next claim (PostgreSQL).

Two `runworker` processes serve two queues. Pausing one: no item of it is
claimed after the pause (the database clock of its claim, give or take one
claim cycle), while the other queue keeps completing; resuming drains it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import Max

import leasing
from leasing import enqueue_many
from leasing.models import Pause, WorkItem
from tests.support.helpers import wait_for
from tests.support.workers import start_workers, stop_workers

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ITEMS = 200
# A claim statement that started before the pause committed may still take
# an item; the workers poll every 50 ms. One second is generous for that.
ONE_CLAIM_CYCLE = timedelta(seconds=1)


def completed(queue: str) -> int:
    return WorkItem.objects.filter(queue_name=queue, status="completed").count()


def test_workers_stop_claiming_a_paused_queue_and_drain_it_after_resume(subprocess_env, tmp_path):
    spec = {"work_type": "test.sleep", "input_data": {"seconds": 0.05}}
    enqueue_many([{**spec, "task_id": f"p-{i}", "queue_name": "paused"} for i in range(ITEMS)])
    enqueue_many([{**spec, "task_id": f"o-{i}", "queue_name": "other"} for i in range(ITEMS * 3)])
    with open(tmp_path / "workers.log", "wb") as log:
        workers = start_workers(2, subprocess_env, log, concurrency=4)
        try:
            wait_for(lambda: completed("paused") >= 10, timeout=120, interval=0.05)
            leasing.pause(queue="paused", by="test", reason="pause under load")
            paused_at = Pause.objects.get().paused_at
            other_at_pause = completed("other")
            # Let several claim cycles pass: the other queue keeps going.
            wait_for(lambda: completed("other") >= other_at_pause + 40, timeout=120)
            claimed = WorkItem.objects.filter(queue_name="paused").exclude(lease_token=0)
            last_claim = claimed.aggregate(last=Max("lease_acquired_at"))["last"]
            claimed_count = claimed.count()
            wait_for(lambda: completed("other") >= other_at_pause + 80, timeout=120)
            assert claimed.count() == claimed_count, "a worker claimed the paused queue"
            pending = WorkItem.objects.filter(queue_name="paused", status="pending").count()
            leasing.resume(queue="paused", by="test", reason="resume")
            wait_for(lambda: completed("paused") == ITEMS, timeout=240, interval=0.1)
        finally:
            stop_workers(workers)
    print(
        f"\npaused with {claimed_count} of {ITEMS} claimed, {pending} pending; "
        f"last claim {(last_claim - paused_at).total_seconds():+.3f} s from the pause"
    )
    assert last_claim <= paused_at + ONE_CLAIM_CYCLE
    assert pending > 0  # the pause really held work back
    assert completed("other") >= other_at_pause + 80
