"""Process execution: handlers in child processes that the worker can stop.

Real `runworker` processes on the test database (both SQLite and PostgreSQL).
The test handlers (tests/testapp/handlers.py, `test.process_*`) record each
start with their child's pid; a child that is stopped must be gone (no
process, or a zombie its worker has not reaped yet) within the bound each
test names, and the item must end as its type's policy says.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from leasing import cancel, enqueue
from leasing.models import Checkpoint, IdempotencyKey, Worker
from leasing.services.operations import Action, apply_action
from tests.support.helpers import process_running, recorded, row, wait_for
from tests.support.workers import leasing_env, parse_summary

pytestmark = pytest.mark.django_db(transaction=True)

# Short enough for the tests; PROCESS_STOP_GRACE is below SHUTDOWN_TIMEOUT (leasing.W006).
GRACE = 1.0
HEARTBEAT = 0.3
# The shutdown of a worker whose handler still hangs when the test stops it: the
# same stop as the default's 30 s, sooner (above GRACE, W006).
HANG_SHUTDOWN = 3.0


def worker(spawn: Any, record: Path, *flags: str, **leasing: Any) -> subprocess.Popen[str]:
    settings = {
        "HEARTBEAT_INTERVAL": HEARTBEAT,
        "LEASE_DURATION": 30,
        "PROCESS_STOP_GRACE": GRACE,
        **leasing,
    }
    return spawn(
        "manage.py",
        "runworker",
        *flags,
        env={
            "LEASING_TEST_RECORD": str(record),
            "LEASING_TEST_PROCESS_HANDLERS": "1",
            **leasing_env(**settings),
        },
    )


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    print(err[-5000:])  # the worker's log, shown when the test fails
    assert proc.returncode == 0, err
    return out


def started(record: Path) -> list[tuple[str, int, int]]:
    """(item, token, child pid) of each run started, in order."""
    return [
        (item, int(token), int(pid.removeprefix("pid=")))
        for item, token, _, pid, *_ in recorded(record, "start")
    ]


def first_start(record: Path) -> tuple[str, int, int]:
    wait_for(lambda: started(record), timeout=60)  # a fresh child sets Django up first
    return started(record)[0]


def ending(item_id: str) -> dict[str, Any]:
    """The snapshot of the item's last `error_boundary` checkpoint (how its attempt ended)."""
    boundary = Checkpoint.objects.filter(
        work_item_id=item_id, checkpoint_type="error_boundary"
    ).latest("sequence_number")
    return dict(boundary.snapshot_data)


def test_a_handler_blocked_in_a_call_is_stopped_at_its_timeout_and_retried(spawn, tmp_path):
    """test.process_sleep: timeout 2 s, max_retries 1, on_lease_expired retry."""
    record = tmp_path / "runs.txt"
    item = enqueue("p", "test.process_sleep", max_retries=1)
    proc = worker(spawn, record)
    try:
        _, token, pid = first_start(record)
        seen = time.monotonic()
        wait_for(lambda: not process_running(pid), timeout=10)
        assert time.monotonic() - seen <= 2 + 2
        wait_for(lambda: row(item.pk)["retry_count"] == 1, timeout=10)
        assert ending(item.pk)["will_retry"] is True
        assert ending(item.pk)["elapsed_ms"] <= (2 + 2) * 1000
        # Retried in a fresh child (the stopped one was replaced).
        wait_for(lambda: len(started(record)) == 2, timeout=60)
        _, second_token, second_pid = started(record)[1]
        assert second_token > token and second_pid != pid
    finally:
        summary = parse_summary(stop(proc))
    assert summary["timed_out"] >= 1
    assert not process_running(pid)


def test_a_handler_spinning_in_python_is_stopped_at_its_timeout_and_failed(spawn, tmp_path):
    """test.process_spin: timeout 2 s, on_lease_expired fail."""
    record = tmp_path / "runs.txt"
    item = enqueue("p", "test.process_spin", max_retries=3)  # failed by its policy alone
    proc = worker(spawn, record)
    try:
        _, _, pid = first_start(record)
        seen = time.monotonic()
        wait_for(lambda: not process_running(pid), timeout=10)
        assert time.monotonic() - seen <= 2 + 2
        wait_for(lambda: row(item.pk)["status"] == "failed", timeout=10)
        assert "Timed out" in row(item.pk)["error_message"]
        assert ending(item.pk)["elapsed_ms"] <= (2 + 2) * 1000
    finally:
        stop(proc)
    assert len(started(record)) == 1  # failed for good: never run again


def test_force_release_stops_the_child_and_the_item_runs_again_without_an_attempt(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    item = enqueue("p", "test.process_hang", max_retries=0)
    # Its second run hangs too: the worker's shutdown stops it after SHUTDOWN_TIMEOUT.
    proc = worker(spawn, record, SHUTDOWN_TIMEOUT=HANG_SHUTDOWN)
    try:
        _, token, pid = first_start(record)
        result = apply_action(
            Action.FORCE_RELEASE, item.pk, expected_token=token, actor="ops", reason="hung"
        )
        assert result.applied
        released = time.monotonic()
        # The renewer finds the lease gone at its next round; the child then gets SIGTERM.
        wait_for(lambda: not process_running(pid), timeout=10)
        assert time.monotonic() - released <= HEARTBEAT + 2
        # Force-release hands the item back: claimed again (token 2) in a fresh child.
        wait_for(lambda: len(started(record)) == 2, timeout=60)
        _, second_token, second_pid = started(record)[1]
        assert second_token == token + 1 and second_pid != pid
        assert row(item.pk)["retry_count"] == 0
    finally:
        summary = parse_summary(stop(proc))
    assert summary["lost"] == 1
    assert not process_running(second_pid)  # the worker's shutdown stopped it too
    # A stopped child leaves nothing running: the run is never an abandoned one.
    assert Worker.objects.get().runs_abandoned_total == 0


def test_cancel_stops_a_child_that_ignores_it_after_the_grace_period(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    item = enqueue("p", "test.process_hang", max_retries=0)
    # A lease shorter than the wait below: only the parent's time-based renewals keep it.
    proc = worker(spawn, record, LEASE_DURATION=1.5)
    try:
        _, token, pid = first_start(record)
        first_expiry = row(item.pk)["lease_expires_at"]
        # Renewed well past the first lease's end (waited for, not slept: a loaded
        # host may delay one renewal), under the same token.
        wait_for(
            lambda: row(item.pk)["lease_expires_at"] - first_expiry >= timedelta(seconds=1),
            timeout=10,
        )
        held = row(item.pk)
        assert (held["status"], held["lease_token"]) == ("in_progress", token)
        cancel(item.pk, actor="ops", reason="not needed")
        asked = time.monotonic()
        wait_for(lambda: not process_running(pid), timeout=10)
        # Seen within a heartbeat interval, ignored for the grace, stopped by SIGTERM.
        assert time.monotonic() - asked <= HEARTBEAT + GRACE + 2
        wait_for(lambda: row(item.pk)["status"] == "cancelled", timeout=10)
        assert ending(item.pk)["reason"] == "cancelled"
    finally:
        summary = parse_summary(stop(proc))
    assert summary["cancelled"] == 1
    assert len(started(record)) == 1


def test_a_cooperative_handler_in_a_child_sees_the_cancel_and_stops_by_itself(spawn, tmp_path):
    """test.until_cancelled polls `ctx.cancelled`; in a child it learns of the request
    from the worker and ends the run itself (its checkpoint raises Cancelled)."""
    record = tmp_path / "runs.txt"
    item = enqueue("p", "test.until_cancelled", {"seconds": 60})
    only = ("--work-type", "test.until_cancelled", "--execution", "process")
    proc = worker(spawn, record, *only, PROCESS_STOP_GRACE=10)
    try:
        wait_for(lambda: recorded(record, "start"), timeout=60)
        cancel(item.pk, actor="ops", reason="stop it")
        took = wait_for(lambda: row(item.pk)["status"] == "cancelled", timeout=10)
        assert took < HEARTBEAT + 2  # well before the 10 s grace: it stopped by itself
        assert recorded(record, "cancelled")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert parse_summary(out)["cancelled"] == 1
    assert "stopped the child process" not in err


def test_a_child_that_dies_fails_its_attempt_and_is_replaced(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    dying = enqueue("p", "test.process_exit", max_retries=0)
    proc = worker(spawn, record)
    try:
        wait_for(lambda: row(dying.pk)["status"] == "failed", timeout=60)
        assert "ended (exit code 7)" in row(dying.pk)["error_message"]
        after = enqueue("p", "test.process_work", {"n": 1})
        wait_for(lambda: row(after.pk)["status"] == "completed", timeout=60)
    finally:
        stop(proc)
    [(_, _, dead), (_, _, fresh)] = started(record)
    assert fresh != dead


def test_a_sigterm_from_outside_hands_the_item_back_without_an_attempt(spawn, tmp_path):
    """A service manager signalling every process of the worker (systemd's default
    KillMode) is not the handler's fault."""
    record = tmp_path / "runs.txt"
    item = enqueue("p", "test.process_hang", max_retries=0)
    # Its second run hangs too: the worker's shutdown stops it after SHUTDOWN_TIMEOUT.
    proc = worker(spawn, record, SHUTDOWN_TIMEOUT=HANG_SHUTDOWN)
    try:
        _, _, pid = first_start(record)
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: row(item.pk)["interruptions"] == 1, timeout=20)
        assert row(item.pk)["retry_count"] == 0
        wait_for(lambda: len(started(record)) == 2, timeout=60)  # and it runs again
    finally:
        summary = parse_summary(stop(proc))
    assert summary["interrupted"] == 1


def test_checkpoints_run_once_and_proof_of_work_beats_work_in_a_child(spawn, tmp_path):
    """test.process_work (beat mode) beats for longer than its lease: only its forwarded
    beats extend the lease; its checkpoints and `run_once` are fenced writes of the child."""
    record = tmp_path / "runs.txt"
    item = enqueue("p", "test.process_work", {"n": 3, "beat_for": 3})
    proc = worker(spawn, record, LEASE_DURATION=1.5)
    try:
        _, _, pid = first_start(record)
        first_expiry = row(item.pk)["lease_expires_at"]
        time.sleep(2)
        assert row(item.pk)["lease_expires_at"] - first_expiry >= timedelta(seconds=1)
        wait_for(lambda: row(item.pk)["status"] == "completed", timeout=20)
    finally:
        summary = parse_summary(stop(proc))
    assert row(item.pk)["output_data"] == {"pid": pid, "effect": {"pid": pid}, "attempt": 1}
    snapshots = Checkpoint.objects.filter(
        work_item_id=item.pk, checkpoint_type="iteration_end"
    ).order_by("sequence_number")
    assert [c.snapshot_data for c in snapshots] == [{"i": 1}, {"i": 2}, {"i": 3}]
    assert IdempotencyKey.objects.filter(idempotency_key=f"effect:{item.pk}").count() == 1
    assert summary["completed"] == 1


def test_a_child_is_replaced_after_process_max_items(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    items = [enqueue("p", "test.process_work", {"n": 1}) for _ in range(3)]
    proc = worker(spawn, record, "--burst", PROCESS_MAX_ITEMS=2)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert [row(item.pk)["status"] for item in items] == ["completed"] * 3, err
    pids = [pid for _, _, pid in started(record)]
    assert len(pids) == 3
    assert pids[0] == pids[1] and pids[2] != pids[0]
    assert parse_summary(out)["completed"] == 3


def test_a_child_is_replaced_above_process_max_memory_mb(spawn, tmp_path):
    """Any Python process with Django set up is above 1 MiB: every item gets a fresh child."""
    record = tmp_path / "runs.txt"
    items = [enqueue("p", "test.process_work", {"n": 1}) for _ in range(2)]
    proc = worker(spawn, record, "--burst", PROCESS_MAX_MEMORY_MB=1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert [row(item.pk)["status"] for item in items] == ["completed"] * 2, err
    [first, second] = [pid for _, _, pid in started(record)]
    assert first != second
    assert "MiB resident" in err


def test_runworker_execution_sets_where_types_that_do_not_choose_run(spawn, tmp_path):
    """test.pid has no `execution` option: a thread of the worker by default, a child
    process with `--execution process`."""
    in_thread = enqueue("p", "test.pid")
    only = ("--burst", "--work-type", "test.pid")  # no process-mode type: no child at all
    proc = worker(spawn, tmp_path / "runs.txt", *only)
    proc.communicate(timeout=90)
    assert row(in_thread.pk)["output_data"] == {"pid": proc.pid}
    in_child = enqueue("p", "test.pid")
    proc = worker(spawn, tmp_path / "runs.txt", *only, "--execution", "process")
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    pid = row(in_child.pk)["output_data"]["pid"]
    assert pid != proc.pid and not process_running(pid)  # the worker's child, gone with it


def test_a_force_released_item_is_not_claimed_again_while_its_child_is_being_stopped(
    spawn, tmp_path
):
    """Its child ignores SIGTERM, so stopping it takes the grace. Meanwhile a free
    executor must not claim the item, only to hand it straight back: that looped,
    a claim and a hand-back a round (310 claims in this test before the fix)."""
    record = tmp_path / "runs.txt"
    item = enqueue("p", "test.process_stubborn")
    stubborn_grace = 2.0
    proc = worker(spawn, record, "--concurrency", "2", PROCESS_STOP_GRACE=stubborn_grace,
                  SHUTDOWN_TIMEOUT=stubborn_grace + 2)  # fmt: skip
    try:
        _, token, pid = first_start(record)
        result = apply_action(
            Action.FORCE_RELEASE, item.pk, expected_token=token, actor="ops", reason="hung"
        )
        assert result.applied
        wait_for(lambda: not process_running(pid), timeout=stubborn_grace + 10)
        wait_for(lambda: len(started(record)) == 2, timeout=60)
        _, second_token, _ = started(record)[1]
        # At most one claim in between: the force-release's own wake-up may claim the
        # item before the renewer sees the lease gone (that claim tells it, and is
        # handed back); then none until the child is gone.
        assert second_token in (token + 1, token + 2)
    finally:
        summary = parse_summary(stop(proc))
    assert summary["claimed"] <= 3, summary
