"""What a handler leaves behind does not outlive its run.

* A transaction left open (an atomic block never exited, autocommit turned off) is
  rolled back when the handler ends, in a thread or in a child process: before, the
  executor's connection stayed idle in it, the next run's checkpoint locked its row
  there, and the worker wedged on that lock for good.
* Processes a process-mode handler started are stopped with its child (its process
  group): before, a `sleep 300` outlived the child its timeout stopped.

Real `runworker` processes on the test database (SQLite and PostgreSQL); the handlers
are in tests/process/leftover_handlers.py, registered by LEASING['HANDLERS'].
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any

import pytest
from django.db import connection

from leasing import enqueue
from leasing.models import Checkpoint
from tests.support.helpers import process_running, row, wait_for
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)

HANDLERS = "tests.process.leftover_handlers"
GRACE = 1.0
LEFT_OPEN = "the handler left a transaction open on database 'default'"


def worker(
    spawn: Any, handlers: dict[str, dict[str, Any]], **leasing: Any
) -> subprocess.Popen[str]:
    settings = {
        "HEARTBEAT_INTERVAL": 0.3,
        "LEASE_DURATION": 30,
        "PROCESS_STOP_GRACE": GRACE,
        "HANDLERS": handlers,
        **leasing,
    }
    return spawn("manage.py", "runworker", "--concurrency", "1", env=leasing_env(**settings))


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    print(err[-5000:])  # the worker's log, shown when the test fails
    assert proc.returncode == 0, err
    return err


def iteration_ends(item_id: str) -> int:
    return Checkpoint.objects.filter(work_item_id=item_id, checkpoint_type="iteration_end").count()


@pytest.mark.parametrize("execution", ["thread", "process"])
def test_a_transaction_left_open_is_rolled_back_and_the_worker_goes_on(spawn, execution):
    names = ["open_atomic", "open_atomic_raises", "autocommit_off", "checkpoints"]
    handlers = {
        f"leftover.{name}": {"handler": f"{HANDLERS}.{name}", "execution": execution}
        for name in names
    }
    proc = worker(spawn, handlers)
    try:
        left = [
            enqueue(f"p-{name}", f"leftover.{name}", max_retries=0)
            for name in ("open_atomic", "open_atomic_raises", "autocommit_off")
        ]
        for item in left:
            wait_for(lambda item=item: row(item.pk)["status"] == "failed", timeout=60)
        # Returned normally: its run fails, as its writes were lost.
        assert LEFT_OPEN in row(left[0].pk)["error_message"]
        assert LEFT_OPEN in row(left[2].pk)["error_message"]
        # Raised: its own error is the outcome.
        assert "raised inside its own transaction" in row(left[1].pk)["error_message"]
        # Their writes in the transaction were rolled back, not committed by a later run.
        assert [iteration_ends(item.pk) for item in left[:2]] == [0, 0]
        if connection.vendor == "postgresql":
            # (Python's sqlite3 opens no transaction before every statement with
            # autocommit off: there, that handler's checkpoint was committed at once.)
            assert iteration_ends(left[2].pk) == 0
        # The next run on the same executor (or child) is not inside that transaction.
        after = enqueue("p-after", "leftover.checkpoints", max_retries=0)
        wait_for(lambda: row(after.pk)["status"] == "completed", timeout=60)
        assert iteration_ends(after.pk) == 1
    finally:
        err = stop(proc)
    assert err.count("left a transaction open on database 'default'; it was rolled back") == 3


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if process_running(pid)]


@pytest.mark.parametrize(
    ("handler", "ending"),
    [("processes_then_hang", "Timed out"), ("processes_then_exit", "exit code 7")],
    ids=["stopped-at-timeout", "child-died"],
)
def test_processes_a_handler_started_end_with_its_child(spawn, tmp_path, handler, ending):
    pids_file = tmp_path / "pids.txt"
    work_type = f"leftover.{handler}"
    options = {"handler": f"{HANDLERS}.{handler}", "execution": "process", "timeout": 2}
    proc = worker(spawn, {work_type: options})
    pids: list[int] = []
    try:
        item = enqueue("p", work_type, {"pids": str(pids_file)}, max_retries=0)
        wait_for(lambda: pids_file.exists() and pids_file.read_text().endswith("\n"), timeout=60)
        pids = [int(pid) for pid in pids_file.read_text().split()]
        wait_for(lambda: row(item.pk)["status"] == "failed", timeout=30)
        assert ending in row(item.pk)["error_message"]
        # `sleep` ends by the SIGTERM; the one that ignores it by the SIGKILL after.
        wait_for(lambda: not alive(pids), timeout=GRACE + 10)
    finally:
        for pid in alive(pids):  # never leave them behind, whatever the outcome
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        stop(proc)


def test_the_child_leads_its_own_process_group_which_the_shutdown_stops(spawn, tmp_path):
    """The child's group is apart from the worker's (a terminal's Ctrl-C reaches the
    worker, which decides); a shutdown that gives up on its run stops that whole group."""
    pids_file = tmp_path / "pids.txt"
    options = {"handler": f"{HANDLERS}.processes_then_hang", "execution": "process"}
    proc = worker(spawn, {"leftover.group": options}, SHUTDOWN_TIMEOUT=3.0)
    pids: list[int] = []
    try:
        enqueue("p", "leftover.group", {"pids": str(pids_file)}, max_retries=0)
        wait_for(lambda: pids_file.exists() and pids_file.read_text().endswith("\n"), timeout=60)
        pids = [int(pid) for pid in pids_file.read_text().split()]
        child = pids[-1]
        assert os.getpgid(child) == child != os.getpgid(proc.pid)
        assert {os.getpgid(pid) for pid in pids} == {child}
        stop(proc)
        wait_for(lambda: not alive(pids), timeout=GRACE + 10)
    finally:
        for pid in alive(pids):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
