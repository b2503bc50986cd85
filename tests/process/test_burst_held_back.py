"""`runworker --burst` exits once nothing is claimable by it and its own work is
done, also while items are held back: by a pause, or by a concurrency limit that
other processes' runs fill (PostgreSQL and SQLite).

A burst that waited for those would poll until an operator resumes the pause,
or until other workers finish (forever, while they keep the limit full). What
the limit holds back because of the burst's own runs is still waited for and
completed.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import leasing
from leasing import LeaseManager, enqueue
from leasing.models import WorkItem
from tests.support.helpers import ROOT
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)

# Far more than a burst of a few items needs: only a worker that never exits reaches it.
BURST_TIMEOUT = 60


def burst(subprocess_env, **leasing: Any) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            [sys.executable, "manage.py", "runworker", "--burst", "--concurrency", "2"],
            cwd=ROOT,
            env={**subprocess_env, **leasing_env(**leasing)},
            capture_output=True,
            text=True,
            timeout=BURST_TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"runworker --burst did not exit: {exc.stderr!r:.3000}") from exc
    assert proc.returncode == 0, proc.stderr
    assert "stopped (burst-done)" in proc.stderr, proc.stderr
    return proc


def status(item: WorkItem) -> tuple[str, int]:
    item.refresh_from_db()
    return item.status, item.lease_token


@pytest.mark.parametrize("paused", ["queue", "work_type"])
def test_burst_exits_leaving_a_paused_item_pending(subprocess_env, paused):
    if paused == "queue":
        leasing.pause(queue="slow", by="test", reason="maintenance")
        held = enqueue("held", "test.noop", queue_name="slow")
    else:
        leasing.pause(work_type="test.echo", by="test", reason="maintenance")
        held = enqueue("held", "test.echo", {"n": 1})
    free = enqueue("free", "test.noop")
    burst(subprocess_env)
    assert status(free) == ("completed", 1)
    assert status(held) == ("pending", 0)  # never claimed


@pytest.mark.parametrize("limited", ["queue", "work_type"])
def test_burst_exits_leaving_items_a_limit_full_of_another_process_s_runs_holds_back(
    subprocess_env, limited
):
    if limited == "queue":
        limits = {"QUEUE_LIMITS": {"lim": 1}}
        spec: dict[str, Any] = {"work_type": "test.noop", "queue_name": "lim"}
    else:
        limits = {"WORK_TYPE_LIMITS": {"test.echo": 1}}
        spec = {"work_type": "test.echo", "input_data": {"n": 1}}
    running = enqueue("running", **spec)
    # Another process holds the limit's one slot (and keeps it past the burst).
    assert LeaseManager("another-process").acquire_lease(600, task_id_filter="running")
    waiting = enqueue("waiting", **spec)
    free = enqueue("free", "test.noop")
    burst(subprocess_env, **limits)
    assert status(free) == ("completed", 1)
    assert status(waiting) == ("pending", 0)
    assert status(running) == ("in_progress", 1)


def test_burst_waits_for_what_a_limit_holds_back_behind_its_own_runs(subprocess_env):
    # Passes without the change too: it guards that the burst still waits when the
    # limit is full of its own runs.
    items = [
        enqueue(f"lim-{i}", "test.sleep", {"seconds": 0.3}, queue_name="lim") for i in range(3)
    ]
    burst(subprocess_env, QUEUE_LIMITS={"lim": 1})
    assert [status(item) for item in items] == [("completed", 1)] * 3
