"""No lease is immortal: a deadline on the database clock caps every lease.

A lease's deadline (`lease_deadline_at`) is fixed when it is claimed: the
handler's `timeout` or `MAX_LEASE_LIFETIME`. No renewal moves the expiry past
it, so even a process that keeps renewing (a wedged handler in `thread` mode)
loses the lease; the worker times the run out itself, and the sweep does it
for a process that cannot.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from leasing import LeaseManager, enqueue
from leasing.exceptions import LeaseExpiredError
from leasing.models import Checkpoint, WorkItem
from leasing.services.terms import claim_filters, claim_terms
from leasing.sql.runner import database_now
from leasing.sweep import RecoverySweep
from tests.conftest import recorded, wait_for
from tests.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_claim_sets_the_deadline_from_max_lease_lifetime(make_items, leasing_settings):
    leasing_settings(MAX_LEASE_LIFETIME=600)
    [item] = make_items(1)
    lease = LeaseManager("w").acquire_lease(lease_duration_seconds=60)
    row = WorkItem.objects.get(pk=item.pk)
    assert row.lease_deadline_at - row.lease_acquired_at == timedelta(seconds=600)
    assert lease.deadline_at == row.lease_deadline_at and lease.cap_seconds == 600


def test_no_renewal_moves_a_lease_past_its_deadline(make_items):
    [item] = make_items(1)
    manager = LeaseManager("w")
    [lease] = manager.claim(1, claim_terms(1.0, cap_seconds=1.5), claim_filters())
    manager.renew_lease(item.pk, 600)
    row = WorkItem.objects.get(pk=item.pk)
    assert row.lease_expires_at == row.lease_deadline_at  # capped, not now + 600 s
    time.sleep(1.6)
    with pytest.raises(LeaseExpiredError, match="reached its deadline"):
        manager.renew_lease(item.pk, 600, token=lease.token)


def test_the_sweep_reports_a_lease_that_ran_into_its_deadline_as_a_time_out(make_items):
    [item] = make_items(1, max_retries=2)
    LeaseManager("wedged").claim(1, claim_terms(60, cap_seconds=90), claim_filters())
    # A wedged process renewed it up to its deadline, which has now passed.
    WorkItem.objects.filter(pk=item.pk).update(
        lease_acquired_at=database_now() - timedelta(seconds=91),
        lease_deadline_at=database_now() - timedelta(seconds=1),
        lease_expires_at=database_now() - timedelta(seconds=1),
    )
    stats = RecoverySweep().scan_and_recover()
    assert stats.recovered == 1
    row = WorkItem.objects.get(pk=item.pk)
    assert (row.status, row.retry_count) == ("pending", 1)
    assert row.error_message == "Timed out after 90 s - retry 1/2"
    boundary = Checkpoint.objects.get(task_id=item.task_id)
    assert boundary.snapshot_data["reason"] == "timed_out"


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


def test_a_per_type_lifetime_caps_the_claim(make_items):
    from leasing.handlers import build_spec

    spec = build_spec("x", lambda ctx: None, timeout=30, max_lease_lifetime=20)
    assert spec.cap_seconds(14400) == 20
    assert build_spec("x", lambda ctx: None, timeout=30).cap_seconds(14400) == 30
    assert build_spec("x", lambda ctx: None).cap_seconds(14400) == 14400
