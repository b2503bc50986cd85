"""Unique keys against a return to pending: the returning item is superseded, never an error.

An item with `unique_while="pending"` gives its key up when a worker claims
it, so a new item may take the key while the first one runs. Every
transition that would put the first one back to pending (a failed attempt's
retry, the sweep's recovery of an expired lease, a hand-back, an
interruption, a force-release) finds the holder and ends the item failed,
"Superseded by <holder>", instead of breaking the key's unique index; an
operator's retry of a failed item whose key is held is skipped.
"""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest

from leasing import enqueue
from leasing.models import WorkItem
from leasing.states import WorkItemStatus
from tests.support.helpers import database_now, row, wait_for
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db


def _superseded(item_id: str, holder: str) -> None:
    r = row(item_id)
    assert r["status"] == WorkItemStatus.FAILED
    assert r["error_message"].startswith(f"Superseded by {holder}, which holds its unique key")
    assert r["lease_holder"] is None and r["completed_at"] is not None


def _holds(item_id: str) -> None:
    assert row(item_id)["status"] == WorkItemStatus.PENDING
    holders = WorkItem.objects.filter(unique_key="k", status=WorkItemStatus.PENDING)
    assert list(holders.values_list("pk", flat=True)) == [item_id]


@pytest.mark.django_db(transaction=True)
def test_a_stopping_worker_hands_such_an_item_over_without_an_error(spawn, tmp_path):
    """The issue's repro with a real `runworker`: SIGTERM past the shutdown timeout."""
    record = tmp_path / "runs.txt"
    a = enqueue("a", "test.sleep", {"seconds": 30}, unique_key="k", unique_while="pending")
    proc = spawn(
        "manage.py",
        "runworker",
        env={"LEASING_TEST_RECORD": str(record), **leasing_env(SHUTDOWN_TIMEOUT=0.5)},
    )
    wait_for(lambda: record.exists() and "start" in record.read_text())
    b = enqueue(
        "b",
        "test.sleep",
        unique_key="k",
        unique_while="pending",
        run_after=database_now() + timedelta(hours=1),
    )
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert f"superseded by {b.pk}" in err
    _superseded(a.pk, b.pk)
    _holds(b.pk)
