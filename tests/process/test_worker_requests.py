"""Quiet and stop of a real `runworker`, honoured within one heartbeat interval."""

from __future__ import annotations

import time

import pytest

from leasing import enqueue
from leasing.models import Worker
from leasing.services import processes
from tests.support.helpers import recorded, row, wait_for
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)

BEAT = 0.5


def _worker(spawn, record, **leasing):
    env = {
        "LEASING_TEST_RECORD": str(record),
        **leasing_env(HEARTBEAT_INTERVAL=BEAT, LEASE_DURATION=30, **leasing),
    }
    proc = spawn("manage.py", "runworker", "--worker-id", "w-ops", env=env)
    wait_for(lambda: Worker.objects.filter(pk="w-ops", status="running").exists())
    return proc


def test_quiet_stops_claims_and_lets_the_running_item_finish_then_stop_exits(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    running = enqueue("running", "test.sleep", {"seconds": 2})
    proc = _worker(spawn, record)
    try:
        wait_for(lambda: recorded(record, "start"))
        assert processes.request("w-ops", "quiet", by="ops", reason="drain")
        took = wait_for(lambda: Worker.objects.get().quiet_since is not None, timeout=5)
        assert took < BEAT + 0.5
        later = enqueue("later", "test.noop")
        wait_for(lambda: row(running.pk)["status"] == "completed", timeout=10)
        time.sleep(1.0)  # twenty claim rounds at the test's poll interval
        assert row(later.pk)["status"] == "pending"
        assert proc.poll() is None  # quiet, not gone: it still beats
        seen = Worker.objects.get().last_seen_at
        wait_for(lambda: Worker.objects.get().last_seen_at > seen, timeout=5)

        assert processes.request("w-ops", "stop", by="ops", reason="maintenance")
        asked = time.monotonic()
        _out, err = proc.communicate(timeout=10)
        assert time.monotonic() - asked < BEAT + 1.5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "quiet requested by ops (drain)" in err
    assert "stop requested by ops (maintenance)" in err
    assert row(later.pk)["status"] == "pending"
    assert Worker.objects.get().status == "stopped"


def test_stop_hands_back_what_outlives_the_shutdown_timeout(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    item = enqueue("long", "test.sleep", {"seconds": 60})
    proc = _worker(spawn, record, SHUTDOWN_TIMEOUT=3)
    try:
        wait_for(lambda: recorded(record, "start"))
        assert processes.request("w-ops", "stop", by="ops", reason="maintenance")
        asked = time.monotonic()
        # The console says stopping while the running item has its shutdown timeout.
        wait_for(lambda: Worker.objects.get().status == "stopping", timeout=3)
        _out, err = proc.communicate(timeout=15)
        assert time.monotonic() - asked < BEAT + 3 + 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    after = row(item.pk)
    assert (after["status"], after["retry_count"], after["lease_holder"]) == ("pending", 0, None)
