"""An item asked to stop whose run ends without its worker: the sweep, or its own deadline.

Its worker dies (the lease runs out) or the run reaches its deadline: either
way the item ends `cancelled`, counted as cancelled (not failed), with a
message that says so and promises no retry.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from leasing import LeaseManager, cancel, enqueue
from leasing.models import Checkpoint, Worker, WorkItem
from leasing.services.terms import claim_filters, claim_terms
from leasing.storage.postgres import PostgresStorage
from leasing.storage.sqlite import SQLiteStorage
from leasing.testing import override_handler, run_handler
from tests.support.helpers import database_now, row
from tests.support.recovery import boundaries, expire, sweep

pytestmark = pytest.mark.django_db


def _running(task_id: str, *, max_retries: int = 3, stop: bool = False) -> str:
    """A claimed item of its own task (asked to stop if `stop`), its worker gone."""
    item = enqueue(task_id, "noop", max_retries=max_retries)
    LeaseManager("dead-worker").acquire_lease(task_id_filter=task_id)
    if stop:
        assert cancel(item.pk, actor="ops", reason="not wanted").applied
    return item.pk


def _expired_mix(tag: str = "") -> dict[str, str]:
    """Three expired leases: one retried, one failed for good, one asked to stop."""
    items = {
        "retried": _running(f"r{tag}"),
        "failed": _running(f"f{tag}", max_retries=0),
        "cancelled": _running(f"c{tag}", stop=True),
    }
    expire(*items.values())
    return items


def test_the_sweep_counts_a_cancelled_item_as_cancelled_not_failed(caplog):
    items = _expired_mix()
    s = sweep()

    with caplog.at_level("INFO", logger="leasing.sweep"):
        stats = s.scan_and_recover()

    assert (stats.expired_found, stats.recovered, stats.failed, stats.cancelled) == (3, 1, 1, 1)
    assert [row(items[k])["status"] for k in ("retried", "failed", "cancelled")] == [
        "pending",
        "failed",
        "cancelled",
    ]
    # The pass's log line, its recorded stats and the sweeper's failure count say so too.
    assert "1 re-queued, 1 failed, 1 cancelled" in caplog.text
    sweeper = Worker.objects.get(worker_id=s.worker_id)
    assert (sweeper.items_recovered, sweeper.items_failed) == (1, 1)
    assert sweeper.last_scan_stats["cancelled"] == 1
    assert s.get_statistics()["total_cancelled"] == 1


def test_recoverysweep_once_reports_the_cancelled_item():
    _expired_mix()
    out = StringIO()
    call_command("recoverysweep", "--once", stdout=out, stderr=StringIO())
    assert "3 expired: 1 re-queued, 1 failed, 1 cancelled;" in out.getvalue()

    _expired_mix("2")
    out = StringIO()
    call_command("recoverysweep", "--once", "--json", stdout=out, stderr=StringIO())
    stats = json.loads(out.getvalue())
    assert (stats["recovered"], stats["failed"], stats["cancelled"]) == (1, 1, 1)


def test_a_batch_recovered_one_by_one_still_counts_the_cancelled_item(monkeypatch):
    items = _expired_mix()
    calls = {"n": 0}

    def flaky(real):
        def batch(*args, **kwargs):
            outcome = real(*args, **kwargs)
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("disk full")  # the whole batch rolls back
            return outcome

        return batch

    for storage in (PostgresStorage, SQLiteStorage):
        monkeypatch.setattr(storage, "recover", flaky(storage.recover))

    stats = sweep().scan_and_recover()

    assert calls["n"] == 4  # the batch, then each row on its own
    assert (stats.errors, stats.recovered, stats.failed, stats.cancelled) == (0, 1, 1, 1)
    assert row(items["cancelled"])["status"] == "cancelled"


def test_the_sweep_ends_a_timed_out_item_asked_to_stop_cancelled_without_a_retry_note():
    item = enqueue("t", "noop", max_retries=3)
    LeaseManager("wedged").claim(1, claim_terms(60, cap_seconds=90), claim_filters())
    cancel(item.pk, actor="ops", reason="not wanted")
    # A wedged process renewed it up to its deadline, which has now passed.
    WorkItem.objects.filter(pk=item.pk).update(
        lease_acquired_at=database_now() - timedelta(seconds=91),
        lease_deadline_at=database_now() - timedelta(seconds=1),
        lease_expires_at=database_now() - timedelta(seconds=1),
    )

    stats = sweep().scan_and_recover()

    assert (stats.recovered, stats.failed, stats.cancelled) == (0, 0, 1)
    r = row(item.pk)
    assert (r["status"], r["retry_count"]) == ("cancelled", 0)
    assert r["error_message"] == "Cancelled as asked; the run ended with: Timed out after 90 s"
    [boundary] = boundaries(item.pk)
    snapshot = boundary.snapshot_data
    assert (snapshot["reason"], snapshot["will_retry"], snapshot["new_status"]) == (
        "cancelled",
        False,
        "cancelled",
    )
    assert snapshot["error"] == r["error_message"]


def test_a_run_past_its_timeout_after_a_stop_request_ends_cancelled_without_a_retry_note():
    def slow(ctx):
        cancel(ctx.lease.work_item_id, actor="ops", reason="not wanted")
        time.sleep(1.2)  # past its timeout, ignoring the request
        return {"late": True}

    with override_handler("test.slow", slow, timeout=1, max_retries=3):
        run = run_handler("test.slow")

    assert run.timed_out
    r = row(run.item.pk)
    assert (r["status"], r["retry_count"]) == ("cancelled", 0)
    assert r["error_message"] == "Cancelled as asked; the run ended with: Timed out after 1 s"
    [boundary] = Checkpoint.objects.filter(
        work_item_id=run.item.pk, checkpoint_type="error_boundary"
    )
    snapshot = boundary.snapshot_data
    assert (snapshot["reason"], snapshot["will_retry"]) == ("cancelled", False)
    assert "retry" not in snapshot["error"]

    # A run not asked to stop still says when it will be retried.
    def slow_alone(ctx):
        time.sleep(1.2)
        return {"late": True}

    with override_handler("test.slow", slow_alone, timeout=1, max_retries=3):
        run = run_handler("test.slow")
    r = row(run.item.pk)
    assert (r["status"], r["error_message"]) == ("pending", "Timed out after 1 s - retry 1/3")
