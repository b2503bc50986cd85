"""No lease is immortal: a deadline on the database clock caps every lease.

A lease's deadline (`lease_deadline_at`) is fixed when it is claimed: the
handler's `timeout` or `MAX_LEASE_LIFETIME`. No renewal moves the expiry past
it, so even a process that keeps renewing (a wedged handler in `thread` mode)
loses the lease; the worker times the run out itself, and the sweep does it
for a process that cannot.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from leasing import enqueue
from leasing.models import Checkpoint, WorkItem
from tests.support.helpers import recorded, wait_for
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_stuck_handler_is_timed_out_by_its_worker(spawn, tmp_path: Path):
    record = tmp_path / "runs.txt"
    stuck = enqueue("stuck", "test.stuck", {"seconds": 30})  # timeout=2, max_retries=0
    # Half a second of work after the stuck item, so the stuck handler's thread
    # (it polls ctx.lease_lost every 50 ms) gets to run before the burst worker exits.
    after = enqueue("after", "test.sleep", {"seconds": 0.5}, priority=-1)
    started = time.monotonic()
    proc = spawn(
        "manage.py",
        "runworker",
        "--burst",
        "--concurrency",
        "1",
        env={
            "LEASING_TEST_RECORD": str(record),
            **leasing_env(HEARTBEAT_INTERVAL=0.2, LEASE_DURATION=1),
        },
    )
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    # The renewer kept renewing it (thread mode), yet the cap ended it.
    assert time.monotonic() - started < 20
    row = WorkItem.objects.get(pk=stuck.pk)
    assert (row.status, row.error_message) == ("failed", "Timed out after 2 s")
    assert row.lease_holder is None
    boundary = Checkpoint.objects.get(task_id="stuck", checkpoint_type="error_boundary")
    assert boundary.snapshot_data["reason"] == "timed_out"
    # The handler was told (ctx.lease_lost), and its executor was replaced, so
    # the next item ran while the stuck one still slept.
    wait_for(lambda: recorded(record, "lease_lost"), timeout=5)
    assert WorkItem.objects.get(pk=after.pk).status == "completed"
    assert "replacing executor-0" in err
