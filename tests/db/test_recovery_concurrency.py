"""The recovery sweep beside completions, workers and other sweeps (real threads, connections)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from leasing import LeaseManager, create_checkpoint, enqueue, enqueue_many
from leasing.exceptions import LeaseLostError
from leasing.models import Checkpoint, WorkItem
from leasing.sweep import RecoveryStats
from tests.support.helpers import database_now, row, wait_for
from tests.support.recovery import boundaries, expire, sweep

pytestmark = pytest.mark.django_db


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
                # This database's only: `make test` runs two PostgreSQL jobs at once.
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
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
