"""The recovery sweep on SQLite and PostgreSQL: one pass, housekeeping, its workers row.

Batches that fail: test_recovery_failures.py; races: test_recovery_concurrency.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils.dateparse import parse_datetime

from leasing import LeaseManager, create_checkpoint, enqueue, enqueue_many
from leasing.exceptions import (
    InvalidDuration,
    InvalidInput,
    LeaseLostError,
)
from leasing.handlers import registry as handlers
from leasing.models import Checkpoint, IdempotencyKey, Worker, WorkItem
from leasing.services import processes
from leasing.sweep import RecoveryStats, RecoverySweep
from tests.support.helpers import database_now, row, wait_for
from tests.support.recovery import boundaries, expire, sweep

pytestmark = pytest.mark.django_db


@pytest.fixture
def fail_on_expiry_type():
    """A work type whose handler says an expired lease must fail, not retry."""
    handlers.register("test.fragile", lambda ctx: None, on_lease_expired="fail")
    yield "test.fragile"
    handlers.unregister("test.fragile")


# --- one item ------------------------------------------------------------------------------


def test_expired_item_is_requeued_with_a_retry_message_and_an_error_boundary(db):
    item = enqueue("task-1", "noop", max_retries=3)
    dead = LeaseManager("dead-worker")
    lease = dead.acquire_lease(lease_duration_seconds=30)
    expire(item.pk)
    # A second back, so "updated_at moved" holds on SQLite's millisecond clock too.
    WorkItem.objects.filter(pk=item.pk).update(updated_at=database_now() - timedelta(seconds=1))
    old = row(item.pk)
    s = sweep()

    stats = s.scan_and_recover()

    assert isinstance(stats, RecoveryStats)
    assert (stats.expired_found, stats.recovered, stats.failed) == (1, 1, 0)
    assert (stats.checkpoints_created, stats.errors, stats.batches) == (1, 0, 1)
    assert stats.scan_duration_ms >= 0 and stats.scanned_at is not None
    new = row(item.pk)
    assert new["status"] == "pending"
    assert new["retry_count"] == 1
    assert new["error_message"] == "Lease expired - retry 1/3"
    assert new["lease_holder"] is None and new["lease_expires_at"] is None
    assert new["run_after"] is None  # claimable again at once
    assert new["completed_at"] is None
    assert new["lease_token"] == lease.token  # the fencing counter is never reset
    assert new["updated_at"] > old["updated_at"]

    [checkpoint] = boundaries(item.pk)
    assert checkpoint.task_id == "task-1" and checkpoint.sequence_number == 1
    snap = checkpoint.snapshot_data
    assert snap["error"] == "Lease expired - retry 1/3"
    assert snap["new_status"] == "pending" and snap["reason"] == "lease_expired"
    assert (snap["retry_count"], snap["max_retries"]) == (1, 3)
    assert snap["worker_id"] == "dead-worker" and snap["attempt"] == 1
    assert snap["lease_token"] == lease.token
    # ISO 8601 (PostgreSQL's jsonb drops trailing zeros of the fraction: compare values).
    assert parse_datetime(snap["lease_expires_at"]) == old["lease_expires_at"]
    assert parse_datetime(snap["heartbeat_at"]) == old["heartbeat_at"]
    assert checkpoint.metadata == {"source": "recovery_sweep", "sweeper": s.worker_id}

    # Recovered means claimable: the next claim gets a new token, so the dead
    # worker's late writes are fenced off.
    again = LeaseManager("new-worker").acquire_lease()
    assert again.work_item_id == item.pk and again.token == lease.token + 1
    with pytest.raises(LeaseLostError):
        dead.release_lease(item.pk, success=True)


def test_only_expired_in_progress_items_are_touched(db):
    pending = enqueue("t", "noop")
    live = enqueue("t", "live")
    done = enqueue("t", "done")
    failed = enqueue("t", "failed")
    m = LeaseManager("w1")
    m.acquire_lease(lease_duration_seconds=60, work_type_filter="live")
    m.acquire_lease(lease_duration_seconds=60, work_type_filter="done")
    m.release_lease(done.pk, success=True)
    m.acquire_lease(lease_duration_seconds=60, work_type_filter="failed")
    m.release_lease(failed.pk, success=False, error="boom")
    before = {i.pk: row(i.pk) for i in (pending, live, done, failed)}

    stats = sweep().scan_and_recover()

    assert (stats.expired_found, stats.recovered, stats.failed) == (0, 0, 0)
    assert {i.pk: row(i.pk) for i in (pending, live, done, failed)} == before
    assert not Checkpoint.objects.exists()


def test_repeated_expiry_retries_then_fails_for_good_and_never_loops(db):
    item = enqueue("poison", "noop", max_retries=3)
    s = sweep()
    messages = []
    for attempt in range(1, 5):
        lease = LeaseManager(f"worker-{attempt}").acquire_lease(lease_duration_seconds=30)
        assert lease is not None and lease.retry_count == attempt - 1
        expire(item.pk)
        stats = s.scan_and_recover()
        assert stats.expired_found == 1
        messages.append(row(item.pk)["error_message"])

    assert messages == [
        "Lease expired - retry 1/3",
        "Lease expired - retry 2/3",
        "Lease expired - retry 3/3",
        "Max retries exceeded",
    ]
    final = row(item.pk)
    assert final["status"] == "failed"
    assert final["retry_count"] == 3  # not incremented past max_retries
    assert final["completed_at"] is not None and final["lease_holder"] is None
    assert stats.failed == 1 and stats.recovered == 0

    checkpoints = boundaries(item.pk)
    assert [c.sequence_number for c in checkpoints] == [1, 2, 3, 4]
    assert [c.snapshot_data["new_status"] for c in checkpoints] == ["pending"] * 3 + ["failed"]
    assert [c.snapshot_data["worker_id"] for c in checkpoints] == [
        f"worker-{n}" for n in range(1, 5)
    ]
    # Terminal: nothing left to sweep or claim.
    assert s.scan_and_recover().expired_found == 0
    assert LeaseManager("w").acquire_lease() is None
    assert s.get_statistics()["total_recovered"] == 3
    assert s.get_statistics()["total_failed"] == 1


def test_zero_max_retries_fails_on_first_expiry(db):
    item = enqueue("t", "noop", max_retries=0)
    LeaseManager("w").acquire_lease()
    expire(item.pk)
    stats = sweep().scan_and_recover()
    assert (stats.recovered, stats.failed) == (0, 1)
    assert row(item.pk)["status"] == "failed"
    assert row(item.pk)["error_message"] == "Max retries exceeded"
    assert row(item.pk)["retry_count"] == 0


def test_fail_policy_type_fails_at_once_while_other_types_retry(db, fail_on_expiry_type):
    fragile = enqueue("t", fail_on_expiry_type, max_retries=3)
    sturdy = enqueue("t", "noop", max_retries=3)
    LeaseManager("w").acquire_leases(2)
    expire(fragile.pk, sturdy.pk)

    stats = sweep().scan_and_recover()

    assert (stats.expired_found, stats.recovered, stats.failed) == (2, 1, 1)
    assert row(fragile.pk)["status"] == "failed"
    assert row(fragile.pk)["retry_count"] == 0
    assert row(fragile.pk)["error_message"] == (
        "Lease expired - not retried (on_lease_expired=fail)"
    )
    assert row(sturdy.pk)["status"] == "pending"
    assert row(sturdy.pk)["error_message"] == "Lease expired - retry 1/3"
    [checkpoint] = boundaries(fragile.pk)
    assert checkpoint.snapshot_data["will_retry"] is False


def test_many_items_are_recovered_in_batches(db):
    items = enqueue_many([{"task_id": f"t{i % 3}", "work_type": "noop"} for i in range(25)])
    LeaseManager("w").acquire_leases(25)
    expire(*[i.pk for i in items])

    stats = sweep(batch_size=10).scan_and_recover()

    assert stats.batches == 3
    assert (stats.expired_found, stats.recovered, stats.checkpoints_created) == (25, 25, 25)
    assert WorkItem.objects.pending().count() == 25
    # Several items of one task in one batch still get distinct, gapless numbers.
    for task in ("t0", "t1", "t2"):
        numbers = list(
            Checkpoint.objects.filter(task_id=task).values_list("sequence_number", flat=True)
        )
        assert numbers == list(range(1, len(numbers) + 1))


def test_checkpoints_can_be_switched_off(db):
    item = enqueue("t", "noop")
    LeaseManager("w").acquire_lease()
    expire(item.pk)
    stats = sweep(create_checkpoints=False).scan_and_recover()
    assert (stats.recovered, stats.checkpoints_created) == (1, 0)
    assert not Checkpoint.objects.exists()


# --- housekeeping -------------------------------------------------------------------------


def test_retention_keeps_the_newest_checkpoints_per_task(db):
    for n in range(8):
        create_checkpoint("long", "manual_checkpoint", {"n": n})
    for n in range(2):
        create_checkpoint("short", "manual_checkpoint", {"n": n})
    s = sweep(checkpoint_retention_limit=5)

    stats = s.scan_and_recover()

    assert stats.checkpoints_deleted == 3
    assert list(Checkpoint.objects.for_task("long").values_list("sequence_number", flat=True)) == [
        4,
        5,
        6,
        7,
        8,
    ]
    assert Checkpoint.objects.for_task("short").count() == 2
    # The next passes only look at tasks that changed, and still prune them.
    for n in range(3):
        create_checkpoint("long", "manual_checkpoint", {"n": 8 + n})
    assert s.scan_and_recover().checkpoints_deleted == 3
    assert list(Checkpoint.objects.for_task("long").values_list("sequence_number", flat=True)) == [
        7,
        8,
        9,
        10,
        11,
    ]
    assert (
        sweep(cleanup_old_checkpoints=False, checkpoint_retention_limit=1)
        .scan_and_recover()
        .checkpoints_deleted
        == 0
    )


def test_expired_idempotency_keys_are_deleted(db):
    now = database_now()
    IdempotencyKey.objects.create(
        idempotency_key="old", request_hash="sha256:x", expires_at=now - timedelta(seconds=1)
    )
    IdempotencyKey.objects.create(
        idempotency_key="fresh", request_hash="sha256:x", expires_at=now + timedelta(hours=1)
    )
    IdempotencyKey.objects.create(idempotency_key="forever", request_hash="sha256:x")

    stats = sweep().scan_and_recover()

    assert stats.keys_expired == 1
    assert set(IdempotencyKey.objects.values_list("pk", flat=True)) == {"fresh", "forever"}


def test_workers_not_seen_for_two_intervals_are_marked_lost(db):
    processes.register("silent-worker", heartbeat_interval=1.0)
    processes.register("busy-worker", heartbeat_interval=1.0)
    Worker.objects.filter(pk="silent-worker").update(
        last_seen_at=database_now() - timedelta(seconds=5)
    )
    s = sweep(scan_interval_seconds=2)

    stats = s.scan_and_recover()

    assert stats.workers_lost == 1
    statuses = dict(Worker.objects.values_list("worker_id", "status"))
    assert statuses["silent-worker"] == "lost"
    assert statuses["busy-worker"] == "running"


# --- the workers table --------------------------------------------------------------------


def test_a_one_off_pass_records_itself_in_a_stopped_sweeper_row(db):
    item = enqueue("t", "noop")
    LeaseManager("w").acquire_lease()
    expire(item.pk)
    s = sweep()
    s.scan_and_recover()
    s.scan_and_recover()

    worker = Worker.objects.get(pk=s.worker_id)
    assert worker.role == "sweeper"
    assert worker.status == "stopped"  # a record of passes, not a live process
    assert worker.scans == 2
    assert worker.items_recovered == 1
    assert worker.last_scan_at is not None
    assert worker.last_scan_stats["expired_found"] == 0  # the second pass
    assert Worker.objects.sweepers().count() == 1


@pytest.mark.django_db(transaction=True)
def test_background_sweep_runs_registers_records_and_stops(db):
    s = sweep(scan_interval_seconds=0.1)
    assert s.get_statistics()["is_running"] is False
    s.start()
    try:
        assert s.is_running()
        with pytest.raises(RuntimeError):
            s.start()
        wait_for(lambda: Worker.objects.filter(pk=s.worker_id, scans__gte=1).exists())
        worker = Worker.objects.get(pk=s.worker_id)
        assert (worker.role, worker.status) == ("sweeper", "running")

        item = enqueue("t", "noop")
        LeaseManager("w").acquire_lease()
        expire(item.pk)
        wait_for(lambda: row(item.pk)["status"] == "pending")
        wait_for(lambda: s.get_statistics()["total_recovered"] == 1)
        statistics = s.get_statistics()
        assert statistics["is_running"] is True
        assert statistics["total_scans"] >= 2
        assert statistics["total_failed"] == 0
        assert statistics["last_scan"] is not None and statistics["last_scan_at"] is not None
    finally:
        assert s.stop(wait=True, timeout=5) is True
    assert s.is_running() is False
    assert s.get_statistics()["is_running"] is False
    worker = Worker.objects.get(pk=s.worker_id)
    assert worker.status == "stopped" and worker.stopped_at is not None
    assert worker.items_recovered == 1
    assert worker.scans == s.get_statistics()["total_scans"]


@pytest.mark.django_db(transaction=True)
def test_a_stopped_sweep_can_be_started_again(db):
    s = sweep(scan_interval_seconds=0.05)
    s.start()
    wait_for(lambda: s.get_statistics()["total_scans"] >= 1)
    assert s.stop() is True
    assert Worker.objects.get(pk=s.worker_id).status == "stopped"
    s.start()
    try:
        wait_for(lambda: Worker.objects.get(pk=s.worker_id).status == "running")
        scans = s.get_statistics()["total_scans"]
        wait_for(lambda: s.get_statistics()["total_scans"] > scans)
    finally:
        s.stop()
    assert Worker.objects.get(pk=s.worker_id).status == "stopped"
    assert Worker.objects.count() == 1


def test_stop_before_start_is_a_no_op(db):
    s = sweep()
    assert s.stop() is True
    assert s.is_running() is False


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"scan_interval_seconds": 0}, InvalidDuration),
        ({"scan_interval_seconds": -1}, InvalidDuration),
        ({"scan_interval_seconds": "60"}, InvalidDuration),
        ({"scan_interval_seconds": float("nan")}, InvalidDuration),
        ({"checkpoint_retention_limit": 0}, InvalidInput),
        ({"checkpoint_retention_limit": 2.5}, InvalidInput),
        ({"batch_size": 0}, InvalidInput),
        ({"batch_size": 100_000}, InvalidInput),
        ({"create_checkpoints": "yes"}, InvalidInput),
        ({"using": "nowhere"}, InvalidInput),
        ({"worker_id": ""}, InvalidInput),
    ],
)
def test_bad_arguments_are_rejected_before_anything_runs(db, kwargs, error):
    item = enqueue("t", "noop")
    LeaseManager("w").acquire_lease()
    expire(item.pk)
    before = row(item.pk)
    with pytest.raises(error):
        RecoverySweep(**kwargs)
    assert row(item.pk) == before
    assert not Worker.objects.exists()
    assert not Checkpoint.objects.exists()
