"""A run that was superseded, or whose handler raised a BaseException, cannot do harm.

Real `runworker` processes: an item force-released (or recovered by the sweep)
while its handler still runs is an abandoned run; the same process does not
run the item again until that handler lets go (a claim of it meanwhile is
handed back at once), then runs it as a new run (a new token), and nothing
the old run returns is written.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from leasing import RecoverySweep, enqueue
from leasing.models import Checkpoint, WorkItem
from leasing.services.operations import Action, apply_action
from tests.support.helpers import recorded, wait_for
from tests.support.workers import leasing_env

pytestmark = [pytest.mark.long, pytest.mark.django_db(transaction=True)]


def worker(spawn, record: Path, *extra: str, lease: float = 300) -> subprocess.Popen:
    leasing = leasing_env(HEARTBEAT_INTERVAL=0.2, LEASE_DURATION=lease)
    return spawn(
        "manage.py", "runworker", *extra, env={"LEASING_TEST_RECORD": str(record), **leasing}
    )


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def test_force_released_item_reclaimed_by_the_same_process_is_completed_by_the_new_run(
    spawn, tmp_path
):
    record = tmp_path / "runs.txt"
    item = enqueue("superseded", "test.sleep_token", {"seconds": 2, "later": 6}, max_retries=3)
    proc = worker(spawn, record, "--concurrency", "2", lease=5)
    wait_for(lambda: len(recorded(record, "start")) == 1)
    first = WorkItem.objects.get(pk=item.pk)
    result = apply_action(
        Action.FORCE_RELEASE,
        item.pk,
        expected_token=first.lease_token,
        actor="tester",
        reason="take it back while it runs",
    )
    assert result.applied
    # The same process, with a free slot, leaves it alone while run 1's thread runs,
    # then runs it anew.
    wait_for(lambda: len(recorded(record, "start")) == 2)
    events = [(line[2], line[1]) for line in recorded(record)]
    assert events[:2] == [("start", "1"), ("end", "1")], events
    token = events[2][1]
    assert events[2][0] == "start" and int(token) > 1
    assert len({line[3] for line in recorded(record)}) == 1  # one process
    time.sleep(0.5)  # run 1's completion would have had time to be written
    row = WorkItem.objects.get(pk=item.pk)
    assert (row.status, str(row.lease_token)) == ("in_progress", token), "run 1 wrote"
    wait_for(lambda: WorkItem.objects.get(pk=item.pk).status == "completed")
    row = WorkItem.objects.get(pk=item.pk)
    assert row.output_data == {"token": int(token)}
    assert row.retry_count == 0  # the hand-backs counted no attempt
    err = stop(proc)
    assert err.count(f"abandoned the run of {item.pk}") == 1, err


def test_item_recovered_by_the_sweep_and_reclaimed_by_the_same_process_stays_the_new_runs(
    spawn, tmp_path
):
    record = tmp_path / "runs.txt"
    item = enqueue("recovered", "test.slow_first_attempt", {"first": 8, "later": 8}, max_retries=3)
    proc = worker(spawn, record, "--concurrency", "2", lease=1.5)
    wait_for(lambda: len(recorded(record, "start")) == 1)
    sweep = RecoverySweep(scan_interval_seconds=0.2)
    # Run 1 never beats, so its lease runs out; the sweep gives the item back.
    wait_for(lambda: sweep.scan_and_recover().recovered == 1, timeout=15, interval=0.2)
    wait_for(lambda: len(recorded(record, "start")) == 2)
    events = [(line[2], line[1]) for line in recorded(record)]
    assert events[:2] == [("start", "1"), ("end", "1")], events  # not while run 1 ran
    token = events[2][1]
    assert events[2][0] == "start" and int(token) > 1
    time.sleep(0.5)
    row = WorkItem.objects.get(pk=item.pk)
    assert (row.status, str(row.lease_token)) == ("in_progress", token), "run 1 wrote"
    wait_for(lambda: WorkItem.objects.get(pk=item.pk).status == "completed")
    assert WorkItem.objects.get(pk=item.pk).output_data == {"token": int(token)}
    stop(proc)


@pytest.mark.parametrize("kind", ["exit", "SystemExit", "KeyboardInterrupt", "GeneratorExit"])
def test_a_base_exception_from_a_handler_fails_its_item_and_the_executor_carries_on(
    spawn, tmp_path, kind
):
    record = tmp_path / "runs.txt"
    bad = enqueue("bad", "test.base_exception", {"raise": kind}, priority=10)
    good = enqueue("good", "test.base_exception", {}, priority=0)
    proc = worker(spawn, record, "--concurrency", "1", "--burst")
    _out, err = proc.communicate(timeout=60)  # before the fix: never exits
    assert proc.returncode == 0, err
    bad_row, good_row = WorkItem.objects.get(pk=bad.pk), WorkItem.objects.get(pk=good.pk)
    assert bad_row.status == "failed"  # max_retries=0: an ordinary handler failure
    assert bad_row.error_message.split(":")[0] in {
        "SystemExit",
        "KeyboardInterrupt",
        "GeneratorExit",
    }
    assert good_row.status == "completed" and good_row.output_data == {"ok": True}
    boundary = Checkpoint.objects.get(task_id="bad", checkpoint_type="error_boundary")
    assert boundary.snapshot_data["reason"] == "handler_error"
    assert boundary.snapshot_data["exception_class_path"].startswith("builtins.")


# The thread's death is the point: Python reports it through threading.excepthook.
