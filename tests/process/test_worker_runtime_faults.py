"""Faults around a worker's runtime that must not leave it broken or leave anything behind.

* An item deleted (force-failed first) while its thread-mode handler still runs: the
  handler's ending meets an item that no longer exists. Before, recording its failure
  and then its hand-back raised `WorkItemNotFound` and killed the executor thread.
* A lease renewer thread that ended: nothing renews the worker's leases or beats its
  row. Before, the worker went on claiming; now it stops as on SIGTERM and exits 70.
* A second Ctrl-C: the worker exits at once. Before, the processes a process-mode
  handler started (in its child's process group) outlived it.

Real `runworker` processes on the test database (SQLite and PostgreSQL).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any

import pytest

from leasing import enqueue
from leasing.models import Worker, WorkItem
from leasing.services.operations import Action, apply_action
from leasing.worker.runtime import EXIT_THREAD_ENDED
from tests.support.helpers import process_running, row, wait_for
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)

FAULTS = "tests.process.runtime_fault_handlers"
LEFTOVERS = "tests.process.leftover_handlers"


def worker(
    spawn: Any, handlers: dict[str, dict[str, Any]], *args: str, **leasing: Any
) -> subprocess.Popen[str]:
    settings = {"HANDLERS": handlers, **leasing}
    return spawn("manage.py", "runworker", *args, env=leasing_env(**settings))


def finish(proc: subprocess.Popen[str], *, terminate: bool = True) -> str:
    """Stop the worker (SIGTERM) if asked, and return its log."""
    if terminate and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    print(err[-8000:])  # the worker's log, shown when the test fails
    return err


@pytest.mark.parametrize("ending", ["raise", "return"])
def test_a_handler_ending_after_its_item_was_deleted_costs_no_executor(spawn, tmp_path, ending):
    started, release = tmp_path / "started", tmp_path / "release"
    handlers = {"fault.until_released": {"handler": f"{FAULTS}.until_released"}}
    # The renewer beats rarely: the handler ends before it notices the item is gone,
    # so the ending itself meets the deleted item.
    proc = worker(spawn, handlers, "--concurrency", "1", HEARTBEAT_INTERVAL=10, LEASE_DURATION=60)
    try:
        item = enqueue(
            "doomed",
            "fault.until_released",
            {"started": str(started), "release": str(release), "ending": ending},
        )
        wait_for(started.exists, timeout=60)
        token = row(item.pk)["lease_token"]
        for action, expected in ((Action.FORCE_FAIL, token), (Action.DELETE, None)):
            result = apply_action(
                action, item.pk, expected_token=expected, actor="ops", reason="test"
            )
            assert result.applied, result
        assert not WorkItem.objects.filter(pk=item.pk).exists()
        release.write_text("go\n")
        # The same executor goes on: a later item completes.
        later = enqueue("later", "test.noop")
        wait_for(lambda: row(later.pk)["status"] == "completed", timeout=30)
    finally:
        err = finish(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "replacing executor-0" not in err
    if ending == "raise":
        # Logged once, as a run whose item is gone (by its ending, or by the renewer).
        assert err.count(f"abandoned the run of {item.pk}") == 1, err


def test_a_worker_whose_renewer_ended_stops_as_on_sigterm_and_exits_70(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    handlers = {"fault.end_the_renewer": {"handler": f"{FAULTS}.end_the_renewer"}}
    proc = spawn(
        "manage.py",
        "runworker",
        "--concurrency",
        "2",
        env={
            "LEASING_TEST_RECORD": str(record),
            **leasing_env(
                HANDLERS=handlers, HEARTBEAT_INTERVAL=0.3, LEASE_DURATION=30, SHUTDOWN_TIMEOUT=1
            ),
        },
    )
    try:
        blocked = enqueue("blocked", "test.sleep", {"seconds": 3600})
        wait_for(lambda: record.exists() and "start" in record.read_text(), timeout=60)
        fault = enqueue("fault", "fault.end_the_renewer")
    finally:
        err = finish(proc, terminate=False)
    assert proc.returncode == EXIT_THREAD_ENDED, err
    assert "its lease renewer thread ended" in err
    assert "(essential-thread-ended)" in err
    # As on SIGTERM: the finished run is written, the one still running handed back
    # (no attempt counted), and the row says the worker stopped.
    assert row(fault.pk)["status"] == "completed"
    blocked_row = row(blocked.pk)
    assert (blocked_row["status"], blocked_row["retry_count"]) == ("pending", 0)
    assert Worker.objects.get().status == "stopped"


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if process_running(pid)]


def test_a_second_ctrl_c_kills_the_processes_a_process_mode_handler_started(spawn, tmp_path):
    pids_file = tmp_path / "pids.txt"
    handlers = {
        "leftover.hang": {"handler": f"{LEFTOVERS}.processes_then_hang", "execution": "process"}
    }
    proc = worker(
        spawn,
        handlers,
        "--concurrency",
        "1",
        HEARTBEAT_INTERVAL=0.3,
        LEASE_DURATION=30,
        SHUTDOWN_TIMEOUT=60,
        PROCESS_STOP_GRACE=30,
    )
    pids: list[int] = []
    try:
        item = enqueue("p", "leftover.hang", {"pids": str(pids_file)}, max_retries=0)
        wait_for(lambda: pids_file.exists() and pids_file.read_text().endswith("\n"), timeout=60)
        pids = [int(pid) for pid in pids_file.read_text().split()]
        proc.send_signal(signal.SIGINT)
        # The first one is acted on (the row says stopping) before the second is sent.
        wait_for(lambda: Worker.objects.get().status == "stopping", timeout=30)
        proc.send_signal(signal.SIGINT)
        err = finish(proc, terminate=False)
        assert proc.returncode == 1, err
        assert "handed back 1 running item(s)" in err
        assert row(item.pk)["status"] == "pending"
        # The child and the processes its handler started (SIGTERM-proof one included).
        wait_for(lambda: not alive(pids), timeout=10)
    finally:
        for pid in alive(pids):  # never leave them behind, whatever the outcome
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
