"""`runworker` as a real process: signals, bad options, database restarts."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from leasing import enqueue, enqueue_many
from leasing.models import Worker, WorkItem
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def runworker_proc(spawn, *args: str, record: Path, **leasing: object) -> subprocess.Popen:
    env = {"LEASING_TEST_RECORD": str(record), **leasing_env(**leasing)}
    return spawn("manage.py", "runworker", *args, env=env)


def test_sigterm_lets_the_running_item_finish_and_exits_zero(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    item = enqueue("t", "test.sleep", input_data={"seconds": 1.0})
    proc = runworker_proc(spawn, record=record, SHUTDOWN_TIMEOUT=10)
    wait_for(lambda: record.exists() and "start" in record.read_text())
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    _out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert time.monotonic() - started < 10
    row = WorkItem.objects.get(pk=item.pk)
    assert row.status == "completed"
    assert row.retry_count == 0
    worker = Worker.objects.get()
    assert worker.status == "stopped"
    assert "SIGTERM received" in err


def test_sigterm_requeues_an_item_that_outlives_the_shutdown_timeout(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    item = enqueue("t", "test.sleep", input_data={"seconds": 30})
    later = enqueue("t2", "test.noop", priority=-1)
    proc = runworker_proc(spawn, record=record, SHUTDOWN_TIMEOUT=0.5, PREFETCH=1)
    wait_for(lambda: record.exists() and "start" in record.read_text())
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    _out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert time.monotonic() - started < 5
    row = WorkItem.objects.get(pk=item.pk)
    # Handed back: pending again, not counted as a retry, lease cleared.
    assert row.status == "pending"
    assert row.retry_count == 0
    assert row.lease_holder is None
    assert WorkItem.objects.get(pk=later.pk).status in {"pending", "completed"}
    assert Worker.objects.get().status == "stopped"
    assert "handed back" in err


def test_pressing_ctrl_c_twice_hands_the_running_items_back_and_exits(spawn, tmp_path):
    """The second signal: one short statement gives the leases back, then the process ends."""
    record = tmp_path / "runs.txt"
    items = enqueue_many(
        [
            {"task_id": f"t{i}", "work_type": "test.sleep", "input_data": {"seconds": 30}}
            for i in range(4)
        ]
    )
    proc = runworker_proc(spawn, "--concurrency", "4", record=record, SHUTDOWN_TIMEOUT=60)
    wait_for(lambda: record.exists() and record.read_text().count("start") == 4)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    second = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=10)
    exited = time.monotonic()
    # At once: not after the 30 s handlers, nor the 60 s shutdown timeout.
    assert exited - second < 3.0
    assert proc.returncode == 1, err
    assert "handed back 4 running item(s)" in err
    wait_for(lambda: WorkItem.objects.filter(status="pending").count() == 4, timeout=2)
    rows = list(WorkItem.objects.filter(pk__in=[i.pk for i in items]))
    assert {(r.status, r.retry_count, r.lease_holder) for r in rows} == {("pending", 0, None)}


@pytest.mark.postgres
def test_a_forced_stop_whose_hand_back_cannot_run_exits_in_time_and_says_so(spawn, tmp_path):
    """Its rows held by another transaction, the hand-back waits; the process exits anyway."""
    import psycopg

    from tests.support.helpers import database_url

    record = tmp_path / "runs.txt"
    item = enqueue("t", "test.sleep", input_data={"seconds": 30})
    proc = runworker_proc(spawn, record=record, SHUTDOWN_TIMEOUT=60)
    wait_for(lambda: record.exists() and "start" in record.read_text())
    blocker = psycopg.connect(database_url())
    try:
        blocker.execute("SELECT 1 FROM work_items WHERE work_item_id = %s FOR UPDATE", [item.pk])
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        second = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=10)
        assert time.monotonic() - second < 3.0
    finally:
        blocker.rollback()
        blocker.close()
    assert proc.returncode == 1
    assert "could not hand the running items back" in err
    # Cancelled on the server by its own bound, not left waiting for the lock.
    assert "statement timeout" in err, err
    assert WorkItem.objects.get(pk=item.pk).status == "in_progress"  # the sweep's now


@pytest.mark.parametrize(
    ("args", "leasing", "expected"),
    [
        (["--concurrency", "0"], {}, "--concurrency: must be a positive whole number"),
        (["--max-items", "x"], {}, "--max-items: expected a whole number"),
        (["--work-type", "no.such"], {}, "No handler is registered for work type 'no.such'"),
        (
            [],
            {"LEASE_DURATION": 10, "HEARTBEAT_INTERVAL": 10},
            "heartbeat interval (10s) must be below the lease duration (10s)",
        ),
        (
            ["--lease-seconds", "10"],
            {},
            "--lease-seconds was removed: set LEASING['LEASE_DURATION']",
        ),
        (["--json"], {}, "--json was removed: the final summary is the last line"),
    ],
)
def test_bad_options_exit_non_zero_with_one_clear_line(spawn, args, leasing, expected):
    proc = spawn("manage.py", "runworker", *args, env=leasing_env(**leasing))
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert expected in lines[0]
    assert not Worker.objects.exists()


@pytest.mark.postgres
def test_worker_survives_its_connections_being_killed(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    items = enqueue_many(
        [
            {"task_id": f"t{i}", "work_type": "test.sleep", "input_data": {"seconds": 0.02}}
            for i in range(150)
        ]
    )
    proc = runworker_proc(
        spawn,
        "--burst",
        "--concurrency",
        "4",
        record=record,
        LEASE_DURATION=30,
        HEARTBEAT_INTERVAL=0.2,
    )
    database = connection.settings_dict["NAME"]

    def kill_worker_connections() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                [database],
            )
            return cursor.fetchone()[0]

    killed = 0
    for round_number in range(1, 4):
        runs_before_kill = 20 * round_number
        wait_for(
            lambda n=runs_before_kill: record.exists() and len(record.read_text().splitlines()) > n
        )
        killed += kill_worker_connections()
        time.sleep(0.3)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert killed > 0
    assert "database unavailable" in err
    assert "database connection restored" in err

    assert WorkItem.objects.completed().count() == len(items)
    finished = Counter(
        line.split()[0] for line in record.read_text().splitlines() if line.split()[2] == "ran"
    )
    # Every item's handler finished exactly once: no result was lost and
    # nothing ran twice, although the connections died under the worker.
    assert set(finished) == {item.pk for item in items}
    assert max(finished.values()) == 1
    assert set(WorkItem.objects.values_list("lease_token", flat=True)) == {1}
