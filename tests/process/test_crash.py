"""Crash recovery end to end: real worker processes killed with SIGKILL, a real sweep."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from leasing import RecoverySweep, enqueue
from leasing.models import Checkpoint, Worker, WorkItem
from tests.support.helpers import database_now
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 1.0
SCAN = 0.3


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.02) -> float:
    """Wait until predicate() is true; return the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def start_worker(spawn, record: Path, *extra: str, prefetch: int | None = None) -> subprocess.Popen:
    leasing = leasing_env(LEASE_DURATION=LEASE, HEARTBEAT_INTERVAL=0.25, PREFETCH=prefetch)
    return spawn(
        "manage.py", "runworker", *extra, env={"LEASING_TEST_RECORD": str(record), **leasing}
    )


def starts(record: Path) -> int:
    if not record.exists():
        return 0
    return sum(1 for line in record.read_text().splitlines() if line.split()[2] == "start")


def test_killed_worker_item_is_recovered_and_completed_by_another(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    item = enqueue("crash-task", "test.sleep", input_data={"seconds": 2.0}, max_retries=3)
    sweep = spawn("manage.py", "recoverysweep", env=leasing_env(SWEEP_INTERVAL=SCAN))
    victim = start_worker(spawn, record)
    wait_for(lambda: starts(record) == 1)
    held = WorkItem.objects.get(pk=item.pk)
    dead_worker, dead_token = held.lease_holder, held.lease_token

    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    recovered_after = wait_for(lambda: WorkItem.objects.get(pk=item.pk).status == "pending")
    # Pending again within lease + one scan interval (plus process scheduling slack).
    assert recovered_after <= LEASE + SCAN + 1.0, recovered_after

    row = WorkItem.objects.get(pk=item.pk)
    assert row.retry_count == 1
    assert row.error_message == "Lease expired - retry 1/3"
    assert row.lease_holder is None
    boundary = Checkpoint.objects.get(task_id="crash-task", checkpoint_type="error_boundary")
    snapshot = boundary.snapshot_data
    assert boundary.work_item_id == item.pk
    flat = repr(snapshot)
    assert dead_worker in flat and str(dead_token) in flat

    rescuer = start_worker(spawn, record, "--burst")
    _out, err = rescuer.communicate(timeout=30)
    assert rescuer.returncode == 0, err
    row = WorkItem.objects.get(pk=item.pk)
    assert row.status == "completed"
    assert row.lease_token == dead_token + 1
    assert row.output_data["slept"] is True

    wait_for(lambda: Worker.objects.get(worker_id=dead_worker).status == "lost")
    sweep.send_signal(signal.SIGTERM)
    _out, err = sweep.communicate(timeout=15)
    assert sweep.returncode == 0, err


def test_poison_item_fails_after_max_retries_instead_of_looping(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    item = enqueue("poison-task", "test.sleep", input_data={"seconds": 30}, max_retries=2)
    sweeper = RecoverySweep(scan_interval_seconds=SCAN)
    sweeper.start()
    try:
        for attempt in range(1, 4):
            victim = start_worker(spawn, record)
            wait_for(lambda n=attempt: starts(record) == n)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            wait_for(lambda: WorkItem.objects.get(pk=item.pk).status != "in_progress")
    finally:
        sweeper.stop()

    row = WorkItem.objects.get(pk=item.pk)
    assert row.status == "failed"
    assert row.error_message == "Max retries exceeded"
    assert row.retry_count == 2
    assert row.lease_token == 3
    messages = [
        cp.snapshot_data
        for cp in Checkpoint.objects.filter(task_id="poison-task", checkpoint_type="error_boundary")
    ]
    assert len(messages) == 3

    # Nothing claims it again: failed is terminal.
    idle = start_worker(spawn, record, "--burst")
    idle.communicate(timeout=30)
    assert WorkItem.objects.get(pk=item.pk).lease_token == 3
    assert starts(record) == 3


def test_sweep_never_takes_a_lease_that_is_kept_alive(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    item = enqueue("alive-task", "test.sleep", input_data={"seconds": 3.0})
    sweeper = RecoverySweep(scan_interval_seconds=0.1)
    sweeper.start()
    try:
        worker = start_worker(spawn, record, "--burst")
        _out, err = worker.communicate(timeout=30)
    finally:
        sweeper.stop()
    assert worker.returncode == 0, err
    row = WorkItem.objects.get(pk=item.pk)
    assert row.status == "completed" and row.retry_count == 0 and row.lease_token == 1
    assert sweeper.get_statistics()["total_recovered"] == 0
    assert row.completed_at <= database_now()


def test_killed_worker_loses_none_of_its_claimed_but_unstarted_batch(spawn, tmp_path):
    from leasing import enqueue_many

    record = tmp_path / "runs.txt"
    items = enqueue_many(
        [
            {"task_id": f"batch-{i}", "work_type": "test.sleep", "input_data": {"seconds": 0.3}}
            for i in range(6)
        ]
    )
    ids = {item.pk for item in items}
    victim = start_worker(spawn, record, "--concurrency", "1", prefetch=5)
    wait_for(lambda: starts(record) >= 1)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    held = WorkItem.objects.filter(pk__in=ids, status="in_progress").count()
    # One running, the rest claimed but never started, all under the dead lease.
    assert held >= 5
    sweeper = RecoverySweep(scan_interval_seconds=SCAN)
    sweeper.start()
    try:
        wait_for(lambda: not WorkItem.objects.filter(pk__in=ids, status="in_progress").exists())
    finally:
        sweeper.stop()
    rescuer = start_worker(spawn, record, "--burst")
    _out, err = rescuer.communicate(timeout=60)
    assert rescuer.returncode == 0, err
    assert WorkItem.objects.filter(pk__in=ids, status="completed").count() == 6


def test_a_worker_restarted_under_its_id_lets_its_dead_predecessors_leases_expire(spawn, tmp_path):
    """A fixed --worker-id kept across restarts (a systemd instance name): the new
    process holds nothing, so the leases its killed predecessor took expire at once
    (the sweep recovers them) instead of passing, in the console, for live leases of a
    live worker that nothing renews."""
    record = tmp_path / "runs.txt"
    long_lease = {"LEASE_DURATION": 60, "HEARTBEAT_INTERVAL": 0.25}
    item = enqueue("held", "test.sleep", input_data={"seconds": 3600}, max_retries=3)
    env = {"LEASING_TEST_RECORD": str(record), **leasing_env(**long_lease)}
    first = spawn("manage.py", "runworker", "--worker-id", "fixed", env=env)
    wait_for(lambda: starts(record) == 1, timeout=60)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    time.sleep(1.0)  # past three of its heartbeat intervals: the id may be taken over
    assert WorkItem.objects.get(pk=item.pk).lease_expires_at > database_now()

    second = spawn("manage.py", "runworker", "--worker-id", "fixed", "--work-type", "test.noop",
                   env=leasing_env(**long_lease))  # fmt: skip
    try:
        wait_for(lambda: WorkItem.objects.get(pk=item.pk).lease_expires_at <= database_now(),
                 timeout=60)  # fmt: skip
        stats = RecoverySweep(scan_interval_seconds=60).scan_and_recover()
        assert stats.recovered == 1
        recovered = WorkItem.objects.get(pk=item.pk)
        assert (recovered.status, recovered.retry_count) == ("pending", 1)
        assert Worker.objects.get(worker_id="fixed").status == "running"
    finally:
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=30)
    assert "1 lease(s) of its earlier process" in err, err
