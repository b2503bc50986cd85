"""The recovery sweep on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils.dateparse import parse_datetime

from leasing import LeaseManager, enqueue, enqueue_many
from leasing.exceptions import (
    DatabaseUnavailable,
    InvalidDuration,
    InvalidInput,
    LeaseLostError,
)
from leasing.handlers import registry as handlers
from leasing.models import Checkpoint, IdempotencyKey, Worker, WorkItem
from leasing.services import processes, recovery
from leasing.services.checkpoints import create_checkpoint
from leasing.sql.runner import database_now
from leasing.sweep import RecoveryStats, RecoverySweep
from tests.conftest import raise_deadlock

pytestmark = pytest.mark.django_db


def expire(*item_ids: str, seconds_ago: float = 1.0) -> None:
    """Move leases' expiry into the past (database clock) instead of waiting."""
    WorkItem.objects.filter(pk__in=item_ids).update(
        lease_expires_at=database_now() - timedelta(seconds=seconds_ago)
    )


def row(item_id: str) -> dict[str, Any]:
    return WorkItem.objects.filter(pk=item_id).values().get()


def boundaries(item_id: str) -> list[Checkpoint]:
    return list(
        Checkpoint.objects.filter(work_item_id=item_id, checkpoint_type="error_boundary").order_by(
            "sequence_number"
        )
    )


def sweep(**kwargs: Any) -> RecoverySweep:
    kwargs.setdefault("scan_interval_seconds", 5)
    return RecoverySweep(**kwargs)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


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


# --- failures -----------------------------------------------------------------------------


def test_a_failing_batch_is_rolled_back_counted_and_retried_next_pass(db, monkeypatch):
    item = enqueue("t", "noop")
    LeaseManager("w").acquire_lease()
    expire(item.pk)
    s = sweep()
    calls = {"n": 0}

    # Fails after the batch's UPDATE and checkpoints, still inside its transaction.
    def flaky(real):
        def batch(*args):
            outcome = real(*args)
            calls["n"] += 1
            if calls["n"] == 1:
                assert outcome.requeued == 1 and outcome.checkpoints == 1
                raise RuntimeError("disk full")
            return outcome

        return batch

    for name in ("_recover_postgres", "_recover_sqlite"):
        monkeypatch.setattr(recovery, name, flaky(getattr(recovery, name)))

    first = s.scan_and_recover()
    assert (first.errors, first.recovered, first.expired_found) == (1, 0, 0)
    assert row(item.pk)["status"] == "in_progress"  # the UPDATE was rolled back too
    assert not Checkpoint.objects.exists()

    second = s.scan_and_recover()
    assert (second.errors, second.recovered) == (0, 1)
    assert row(item.pk)["status"] == "pending"
    assert len(boundaries(item.pk)) == 1
    assert s.get_statistics()["total_errors"] == 1


def test_a_batch_aborted_by_a_deadlock_runs_again_in_the_same_pass(db, monkeypatch, caplog):
    items = enqueue_many([{"task_id": f"t{i}", "work_type": "noop"} for i in range(3)])
    LeaseManager("w").acquire_leases(3)
    expire(*[i.pk for i in items])
    aborted = []

    def deadlock_once(real):
        def batch(*args):
            if not aborted:
                outcome = real(*args)  # its writes roll back with the error
                aborted.append(outcome)
                raise_deadlock()
            return real(*args)

        return batch

    for name in ("_recover_postgres", "_recover_sqlite"):
        monkeypatch.setattr(recovery, name, deadlock_once(getattr(recovery, name)))

    with caplog.at_level("WARNING", logger="leasing.sweep"):
        stats = sweep().scan_and_recover()

    assert aborted and aborted[0].requeued == 3
    assert (stats.errors, stats.expired_found, stats.recovered, stats.batches) == (0, 3, 3, 1)
    assert WorkItem.objects.pending().count() == 3
    assert Checkpoint.objects.count() == 3  # the aborted batch's checkpoints are gone
    assert "a batch was aborted (deadlock detected); running it again" in caplog.text


def test_a_batch_that_keeps_deadlocking_is_given_up_for_this_pass(db, monkeypatch):
    item = enqueue("t", "noop")
    LeaseManager("w").acquire_lease()
    expire(item.pk)

    def always_deadlocks(*args):
        raise_deadlock()

    for name in ("_recover_postgres", "_recover_sqlite"):
        monkeypatch.setattr(recovery, name, always_deadlocks)

    stats = sweep().scan_and_recover()
    assert (stats.errors, stats.recovered) == (1, 0)
    assert row(item.pk)["status"] == "in_progress"


@pytest.mark.django_db(transaction=True)
def test_background_sweep_survives_a_database_outage(db, monkeypatch):
    from leasing.sweep import sweep as sweep_module

    real = sweep_module.database_now
    outages = {"left": 2}

    def down(using: str = "default"):
        if outages["left"]:
            outages["left"] -= 1
            raise DatabaseUnavailable("Database unavailable: connection refused")
        return real(using)

    monkeypatch.setattr(sweep_module, "database_now", down)
    item = enqueue("t", "noop")
    LeaseManager("w").acquire_lease()
    expire(item.pk)
    s = sweep(scan_interval_seconds=0.05)
    s.start()
    try:
        wait_for(lambda: row(item.pk)["status"] == "pending")
        wait_for(lambda: s.get_statistics()["total_recovered"] == 1)
        assert s.get_statistics()["total_errors"] == 2
        assert s.is_running()
    finally:
        s.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_requeued_items_wake_listening_workers_on_commit_failed_ones_do_not(db):
    import psycopg

    from leasing.sql.new_items import NOTIFY_CHANNEL
    from tests.conftest import database_url

    retried = enqueue("t", "noop", queue_name="q-retry")
    failed = enqueue("t", "noop", queue_name="q-final", max_retries=0)
    assert len(LeaseManager("w").acquire_leases(2)) == 2
    expire(retried.pk, failed.pk)
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
        stats = sweep().scan_and_recover()
        payloads = [n.payload for n in listener.notifies(timeout=0.5)]
    assert (stats.recovered, stats.failed) == (1, 1)
    assert payloads == ["q-retry"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_background_sweep_reconnects_after_its_connection_is_killed(db):
    s = sweep(scan_interval_seconds=0.05)
    s.start()
    try:
        wait_for(lambda: s.get_statistics()["total_scans"] >= 1)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        item = enqueue("t", "noop")
        LeaseManager("w").acquire_lease()
        expire(item.pk)
        wait_for(lambda: row(item.pk)["status"] == "pending")
        assert s.get_statistics()["total_errors"] >= 1
        assert s.is_running()
    finally:
        s.stop()
    assert Worker.objects.get(pk=s.worker_id).status == "stopped"


# --- concurrency ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_sweep_racing_a_completion_never_both_win(db, threads):
    s = sweep(cleanup_old_checkpoints=False)
    outcomes: Counter[str] = Counter()
    for round_ in range(30):
        item = enqueue(f"race-{round_}", "noop")
        manager = LeaseManager(f"racer-{round_}")
        lease = manager.acquire_lease(lease_duration_seconds=30, task_id_filter=item.task_id)
        assert lease.work_item_id == item.pk
        expire(item.pk)

        def race(i: int, manager=manager, item=item) -> Any:
            if i == 0:
                try:
                    manager.release_lease(item.pk, success=True, output_data={"done": True})
                    return "completed"
                except LeaseLostError:
                    return "swept"
            return s.scan_and_recover()

        completion, stats = threads(2, race)
        final = row(item.pk)
        checkpoints = boundaries(item.pk)
        assert final["lease_token"] == lease.token
        if completion == "completed":
            assert (stats.expired_found, stats.recovered) == (0, 0)
            assert final["status"] == "completed" and final["retry_count"] == 0
            assert final["output_data"] == {"done": True}
            assert checkpoints == []
        else:
            assert (stats.expired_found, stats.recovered) == (1, 1)
            assert final["status"] == "pending" and final["retry_count"] == 1
            assert final["output_data"] is None
            assert len(checkpoints) == 1
        outcomes[completion] += 1
    assert sum(outcomes.values()) == 30, outcomes


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_an_item_locked_by_its_worker_is_skipped_not_waited_for(db):
    item = enqueue("t", "noop")
    manager = LeaseManager("slow-releaser")
    manager.acquire_lease(lease_duration_seconds=30)
    expire(item.pk)
    locked, release = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def worker() -> None:
        # A worker mid-release: it holds the row lock while it finishes.
        try:
            with transaction.atomic():
                WorkItem.objects.select_for_update().get(pk=item.pk)
                locked.set()
                release.wait(10)
                manager.release_lease(item.pk, success=True)
            result["ok"] = True
        finally:
            connection.close()

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        stats = sweep().scan_and_recover()
        assert time.monotonic() - started < 2  # SKIP LOCKED: no waiting
        assert stats.expired_found == 0 and stats.errors == 0
    finally:
        release.set()
        t.join(10)
    assert result == {"ok": True}
    assert row(item.pk)["status"] == "completed"
    assert sweep().scan_and_recover().expired_found == 0
    assert boundaries(item.pk) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_checkpoint_for_an_item_in_a_sweep_batch_does_not_deadlock_with_it(db):
    # A writer holds the task's sequence lock and then inserts a checkpoint
    # for an item the sweep has locked (its foreign-key check must not wait
    # for the sweep), while the sweep waits for that same sequence lock.
    from leasing.services.checkpoints import lock_task_sequences

    item = enqueue("shared-task", "noop")
    LeaseManager("dead").acquire_lease()
    expire(item.pk)
    holding, sweep_waits = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def writer() -> None:
        try:
            with transaction.atomic():
                lock_task_sequences("default", ["shared-task"])
                holding.set()
                sweep_waits.wait(10)
                checkpoint = create_checkpoint(
                    "shared-task", "manual_checkpoint", {"by": "writer"}, work_item=item.pk
                )
                outcome["writer"] = checkpoint.sequence_number
        except Exception as exc:  # pragma: no cover - reported below
            outcome["writer"] = exc
        finally:
            connection.close()

    def sweeper() -> None:
        try:
            outcome["sweep"] = sweep(cleanup_old_checkpoints=False).scan_and_recover()
        finally:
            connection.close()

    threads_ = [threading.Thread(target=writer), threading.Thread(target=sweeper)]
    threads_[0].start()
    assert holding.wait(10)
    threads_[1].start()

    def sweep_is_waiting_for_the_sequence_lock() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )
            return cursor.fetchone()[0] > 0

    wait_for(sweep_is_waiting_for_the_sequence_lock)
    sweep_waits.set()
    for t in threads_:
        t.join(15)
    assert outcome["writer"] == 1, outcome
    stats = outcome["sweep"]
    assert (stats.errors, stats.recovered) == (0, 1)
    assert [c.sequence_number for c in boundaries(item.pk)] == [2]


@pytest.mark.django_db(transaction=True)
def test_two_sweeps_recover_5000_items_exactly_once_beside_live_workers(db, threads):
    n_expired, n_tasks, n_live = 5000, 250, 200
    enqueue_many(
        [{"task_id": f"task-{i % n_tasks}", "work_type": "noop"} for i in range(n_expired)]
    )
    enqueue_many([{"task_id": f"live-{i}", "work_type": "live"} for i in range(n_live)])
    dead = LeaseManager("dead-worker")
    for _ in range(n_expired // 1000):
        dead.acquire_leases(1000, lease_duration_seconds=60, work_type_filter="noop")
    live = [LeaseManager(f"live-worker-{k}") for k in range(2)]
    for manager in live:
        manager.acquire_leases(n_live // 2, lease_duration_seconds=60, work_type_filter="live")
    WorkItem.objects.filter(work_type="noop").update(
        lease_expires_at=database_now() - timedelta(seconds=5)
    )
    assert WorkItem.objects.expired().count() == n_expired
    assert WorkItem.objects.live().count() == n_live
    sweeps = [sweep(batch_size=100, cleanup_old_checkpoints=False) for _ in range(2)]

    def work(i: int) -> Any:
        if i < 2:
            return sweeps[i].scan_and_recover()
        manager = live[i - 2]
        completed = 0
        for lease in manager.held_leases():
            manager.renew_lease(lease.work_item_id, lease_duration_seconds=60)
            manager.release_lease(
                lease.work_item_id, success=True, output_data={"by": manager.worker_id}
            )
            completed += 1
        return completed

    started = time.monotonic()
    results = threads(4, work)
    elapsed = time.monotonic() - started
    stats: list[RecoveryStats] = results[:2]

    assert results[2:] == [n_live // 2, n_live // 2]
    assert sum(s.errors for s in stats) == 0, stats
    assert sum(s.expired_found for s in stats) == n_expired, stats
    assert sum(s.recovered for s in stats) == n_expired, stats
    assert sum(s.failed for s in stats) == 0
    assert sum(s.checkpoints_created for s in stats) == n_expired
    assert elapsed < 60, elapsed

    # Every expired item recovered exactly once.
    assert not WorkItem.objects.expired().exists()
    recovered = WorkItem.objects.filter(work_type="noop")
    assert (
        recovered.filter(
            status="pending",
            retry_count=1,
            error_message="Lease expired - retry 1/3",
            lease_holder__isnull=True,
        ).count()
        == n_expired
    )
    per_item = Counter(
        Checkpoint.objects.filter(checkpoint_type="error_boundary").values_list(
            "work_item_id", flat=True
        )
    )
    assert len(per_item) == n_expired and set(per_item.values()) == {1}
    assert set(per_item) == set(recovered.values_list("pk", flat=True))
    # Both sweeps numbered checkpoints of the same tasks without a collision or gap.
    per_task: dict[str, list[int]] = {}
    for task, number in Checkpoint.objects.values_list("task_id", "sequence_number"):
        per_task.setdefault(task, []).append(number)
    assert len(per_task) == n_tasks
    for numbers in per_task.values():
        assert sorted(numbers) == list(range(1, n_expired // n_tasks + 1))
    holders = Counter(
        c["worker_id"]
        for c in Checkpoint.objects.values_list("snapshot_data", flat=True).iterator()
    )
    assert holders == {"dead-worker": n_expired}

    # No live lease was touched: completed by its own worker, never swept.
    live_items = WorkItem.objects.filter(work_type="live")
    assert live_items.filter(status="completed", retry_count=0, lease_token=1).count() == n_live
    for manager in live:
        assert live_items.filter(output_data__by=manager.worker_id).count() == n_live // 2
    assert not Checkpoint.objects.filter(work_item__work_type="live").exists()


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
