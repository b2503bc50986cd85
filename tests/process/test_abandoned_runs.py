"""Thread mode owns up: a run fenced out while its handler thread still runs is an abandoned
run, counted in the `workers` row and /metrics, logged once, its item not claimed again by
that worker while the thread lives; past LEASING["MAX_ABANDONED_RUNS"] the worker exits 75."""

from __future__ import annotations

import contextlib
import re
import signal
import time
from pathlib import Path

import pytest

from leasing import enqueue
from leasing.metrics import render_latest
from leasing.models import Worker
from leasing.services.operations import Action, apply_action
from leasing.worker.runtime import EXIT_ABANDONED_RUNS
from tests.support.helpers import process_running, row, wait_for
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)

# A handler blocked for an hour (test.sleep ignores its lease): only a new process frees it.
BLOCKED = {"seconds": 3600}


def _metric(name: str, labels: str = "") -> float:
    body = render_latest()[0].decode()
    match = re.search(rf"^leasing_{name}{re.escape(labels)} (\S+)$", body, re.MULTILINE)
    assert match, body
    return float(match[1])


def _force_release(item_id: str) -> None:
    result = apply_action(
        Action.FORCE_RELEASE, item_id, expected_token=None, actor="ops", reason="hung"
    )
    assert result.applied, result


def _worker(spawn, record, *args: str, env: dict[str, str] | None = None, **leasing: object):
    """A runworker process, returned once it registered (start-up is slow on a busy host)."""
    env = {"LEASING_TEST_RECORD": str(record), **(env or {}), **leasing_env(**leasing)}
    proc = spawn("manage.py", "runworker", *args, env=env)
    wait_for(lambda: Worker.objects.filter(status="running").exists(), timeout=60)
    return proc


def _starts(record, item_id: str) -> int:
    if not record.exists():
        return 0
    return sum(
        1 for line in record.read_text().splitlines() if line.split()[:3:2] == [item_id, "start"]
    )


def test_a_blocked_run_force_released_is_counted_not_reclaimed_and_past_the_bound_exits_75(
    spawn, tmp_path
):
    record = tmp_path / "runs.txt"
    first = enqueue("hung-1", "test.sleep", BLOCKED)
    proc = _worker(
        spawn,
        record,
        "--concurrency",
        "2",
        HEARTBEAT_INTERVAL=0.3,
        LEASE_DURATION=30,
        MAX_ABANDONED_RUNS=1,
    )
    try:
        wait_for(lambda: _starts(record, first.pk) == 1, timeout=30)
        _force_release(first.pk)

        # Counted at the next beat, in the row and in /metrics.
        wait_for(lambda: Worker.objects.get().runs_abandoned == 1, timeout=15)
        worker = Worker.objects.get()
        assert worker.runs_abandoned_total == 1
        assert _metric("worker_runs", '{state="abandoned"}') == 1
        assert _metric("abandoned_runs_total") == 1

        # Its item is pending and claimable, yet this worker leaves it alone while the
        # thread lives; it still claims other work (its executor was replaced).
        other = enqueue("other", "test.noop")
        wait_for(lambda: row(other.pk)["status"] == "completed", timeout=30)
        time.sleep(1.5)  # many claim rounds at the test's 0.05 s poll
        assert row(first.pk)["status"] == "pending"
        assert _starts(record, first.pk) == 1
        assert proc.poll() is None

        # A second abandoned run is past the bound of 1: no more claims, then exit 75.
        second = enqueue("hung-2", "test.sleep", BLOCKED)
        wait_for(lambda: _starts(record, second.pk) == 1, timeout=30)
        _force_release(second.pk)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == EXIT_ABANDONED_RUNS, err
    assert row(first.pk)["status"] == "pending"
    assert row(second.pk)["status"] == "pending"
    assert _starts(record, first.pk) == 1
    # Logged once per abandoned run, not once a beat.
    assert err.count(f"abandoned the run of {first.pk}") == 1, err
    assert err.count(f"abandoned the run of {second.pk}") == 1, err
    assert f"lease on {first.pk}" not in err
    assert "more than LEASING['MAX_ABANDONED_RUNS'] (1)" in err
    worker = Worker.objects.get()
    assert worker.status == "stopped"
    assert worker.runs_abandoned_total == 2


def test_a_run_past_its_timeout_is_abandoned_until_its_thread_lets_go(spawn, tmp_path):
    """test.stuck (timeout 2 s, no retries) ignores everything for 6 s: timed out and failed
    at 2 s, counted abandoned until its thread ends, then no longer."""
    record = tmp_path / "runs.txt"
    item = enqueue("stuck", "test.stuck", {"seconds": 6})
    proc = _worker(spawn, record, HEARTBEAT_INTERVAL=0.3, LEASE_DURATION=30)
    try:
        wait_for(lambda: row(item.pk)["status"] == "failed", timeout=30)
        wait_for(lambda: Worker.objects.get().runs_abandoned == 1, timeout=15)
        assert Worker.objects.get().runs_abandoned_total == 1
        # The handler returns after 6 s; the next beat counts it gone.
        wait_for(lambda: Worker.objects.get().runs_abandoned == 0, timeout=30)
        assert Worker.objects.get().runs_abandoned_total == 1
        assert row(item.pk)["status"] == "failed"  # nothing the late handler returned was written
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert err.count(f"abandoned the run of {item.pk}") == 1, err
    assert f"the abandoned run of {item.pk} (token 1) ended" in err


def test_a_beat_mode_handler_that_stops_beating_is_abandoned_once_the_sweep_recovers_it(
    spawn, tmp_path
):
    """Nothing renews a silent beat-mode lease, so no renewal finds it gone: the renewer asks
    what became of it once it ran out, and abandons the run when the sweep has recovered it
    (not before: while the lease is only expired its ending could still land)."""
    from leasing import RecoverySweep

    record = tmp_path / "runs.txt"
    item = enqueue("silent", "test.beat_sleep", {"seconds": 30, "every": 0}, max_retries=3)
    proc = _worker(spawn, record, HEARTBEAT_INTERVAL=0.25, LEASE_DURATION=1)
    try:
        wait_for(lambda: row(item.pk)["status"] == "in_progress", timeout=20)
        time.sleep(2.5)  # expired for a while, not recovered: still this run's
        assert Worker.objects.workers().get().runs_abandoned == 0
        sweep = RecoverySweep(scan_interval_seconds=0.2)
        wait_for(lambda: sweep.scan_and_recover().recovered == 1, timeout=15, interval=0.2)
        wait_for(lambda: Worker.objects.workers().get().runs_abandoned == 1, timeout=20)
        # The worker leaves the item alone while the silent thread runs.
        time.sleep(1.0)
        assert row(item.pk)["status"] == "pending"
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
    assert err.count(f"abandoned the run of {item.pk}") == 1, err
    assert err.count(f"lease on {item.pk} (token 1) lost") == 1, err  # the expiry, once


def _children(pid: int) -> set[int]:
    """The pids of a worker's child processes that run handlers (every thread's children,
    less multiprocessing's resource tracker, which ends on its own once the worker is gone)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found.update(int(c) for c in (task / "children").read_text().split())
    return {c for c in found if b"resource_tracker" not in _cmdline(c)}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_worker_with_child_processes_exits_despite_an_abandoned_thread_mode_run(spawn, tmp_path):
    """A worker that also runs a type in `process` mode keeps an idle child per executor.
    The executor stuck in an abandoned thread-mode run never closed its child, and at
    exit Python waited for that child forever: the worker said 'stopped' and never
    exited. Its child is now stopped when the executor is replaced."""
    record = tmp_path / "runs.txt"
    hung = enqueue("hung", "test.sleep", BLOCKED)
    children_env = {"LEASING_TEST_PROCESS_HANDLERS": "1"}  # test.process_* run in children
    proc = _worker(spawn, record, "--concurrency", "2", env=children_env,
                   HEARTBEAT_INTERVAL=0.3, LEASE_DURATION=30, PROCESS_STOP_GRACE=1.0,
                   SHUTDOWN_TIMEOUT=3)  # fmt: skip
    try:
        wait_for(lambda: _starts(record, hung.pk) == 1, timeout=60)
        wait_for(lambda: len(_children(proc.pid)) >= 2, timeout=60)  # one child per executor
        children = _children(proc.pid)
        _force_release(hung.pk)
        wait_for(lambda: Worker.objects.get().runs_abandoned == 1, timeout=15)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    outlived = [pid for pid in children if process_running(pid)]
    assert not outlived, f"a child outlived its worker: {err}"
    assert Worker.objects.get().status == "stopped"
