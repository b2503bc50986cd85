"""Cancellation: a pending item at once, a running one asked to stop, audited, with its
dependents following their policy; through the API, the admin and the command."""

from __future__ import annotations

from datetime import timedelta

import pytest

from leasing import cancel, enqueue
from leasing.models import Checkpoint
from tests.support.helpers import row, wait_for

pytestmark = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)
def test_a_cooperative_running_handler_stops_within_one_heartbeat_interval(spawn, tmp_path):
    """A real worker: the request reaches the handler at the renewer's next round."""
    from tests.support.workers import leasing_env

    record = tmp_path / "runs.txt"
    item = enqueue("a", "test.until_cancelled", {"seconds": 60})
    proc = spawn(
        "manage.py",
        "runworker",
        env={
            "LEASING_TEST_RECORD": str(record),
            **leasing_env(HEARTBEAT_INTERVAL=0.5, LEASE_DURATION=30, POLL_INTERVAL=0.05),
        },
    )
    try:
        wait_for(lambda: record.exists() and "start" in record.read_text())
        cancel(item.pk, actor="ops", reason="stop it")
        took = wait_for(lambda: row(item.pk)["status"] == "cancelled", timeout=10)
        assert took < 0.5 + 1.0  # one heartbeat interval, and the round trip
        assert "cancelled" in record.read_text()
        boundary = Checkpoint.objects.get(work_item_id=item.pk, checkpoint_type="error_boundary")
        assert boundary.snapshot_data["reason"] == "cancelled"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert timedelta(0) <= row(item.pk)["completed_at"] - row(item.pk)["cancel_requested_at"]
