"""The queues and work types table of the dashboard, and who serves each row."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.test import Client

from leasing import LeaseManager, enqueue
from leasing.console.dashboard import build_dashboard
from leasing.console.finished import histogram_percentile
from leasing.models import Worker
from leasing.sql.rollups import bucket_of
from tests.support.admin import VIEW_ALL, claim, dashboard_url, make_user, shift
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_cached_figures():
    cache.clear()


def worker(worker_id: str, types: list[str], queues: list[str] | None = None, **fields) -> None:
    Worker.objects.create(
        worker_id=worker_id,
        hostname="h",
        pid=1,
        work_types=types,
        queues=queues or [],
        **fields,
    )


def finished(task_id: str, work_type: str, run_seconds: float, *, success: bool = True) -> str:
    """An item whose last attempt ran `run_seconds` (database clock) and ended just now."""
    lease = claim(task_id, "w-x", work_type=work_type, max_retries=0)
    LeaseManager("w-x").release_lease(
        lease.work_item_id, success, error=None if success else "boom", token=lease.token
    )
    shift(lease.work_item_id, lease_acquired_at=-run_seconds - 5, completed_at=-5)
    return lease.work_item_id


def rows_by_pair() -> dict:
    return {(r.queue_name, r.work_type): r for r in build_dashboard().queues}


def test_counts_rates_and_run_time_percentiles_per_queue_and_type():
    for n in range(3):
        enqueue(f"p{n}", "send_invoice", queue_name="billing")
    enqueue("later", "send_invoice", queue_name="billing",
            run_after=database_now() + timedelta(hours=1))  # fmt: skip
    claim("running", "w-1", work_type="send_invoice", queue_name="billing")
    for n, seconds in enumerate((1, 2, 3, 4, 10)):
        finished(f"ok{n}", "resize", seconds)
    finished("bad", "resize", 7, success=False)
    old = finished("old", "resize", 100)
    shift(old, completed_at=-7200)  # outside the one-hour window

    rows = rows_by_pair()
    billing = rows[("billing", "send_invoice")]
    assert (billing.pending, billing.deferred, billing.claimable, billing.in_flight) == (4, 1, 3, 1)
    assert 0 <= billing.oldest_pending_age_seconds < 60
    resize = rows[("default", "resize")]
    assert (resize.completed, resize.failed, resize.pending) == (5, 1, 0)
    assert resize.failure_rate == pytest.approx(1 / 6)
    # Run time of the completed ones only: 1, 2, 3, 4, 10 s; percentile_cont gives
    # 3.0 and 8.8, the histograms the same within 6%.
    assert resize.p50_seconds == pytest.approx(3.0, rel=0.06)
    assert resize.p95_seconds == pytest.approx(8.8, rel=0.06)


def test_pending_work_without_a_live_worker_is_unserved_and_listed_first():
    enqueue("a", "send_invoice", queue_name="billing")
    enqueue("b", "resize", queue_name="media")
    enqueue("c", "report")
    enqueue("d", "sync")
    worker("w-billing", ["send_invoice"], ["billing"])
    worker("w-all-queues", ["resize"])
    worker("w-wrong-queue", ["report"], ["billing"])
    worker("w-stopped", ["sync"], status="stopped")
    worker("w-silent", ["sync"])
    Worker.objects.filter(pk="w-silent").update(last_seen_at=database_now() - timedelta(hours=1))

    rows = build_dashboard().queues
    by_pair = {(r.queue_name, r.work_type): r for r in rows}
    assert by_pair[("billing", "send_invoice")].worker_ids == ("w-billing",)
    assert by_pair[("media", "resize")].worker_ids == ("w-all-queues",)  # no queues: all
    assert by_pair[("default", "report")].unserved  # its worker takes only "billing"
    assert by_pair[("default", "sync")].unserved  # one worker stopped, one silent
    assert [r.unserved for r in rows] == [True, True, False, False]  # problems first


def test_the_dashboard_shows_unserved_rows_in_red_with_a_tile(leasing_settings):
    enqueue("a", "orphan_type")
    enqueue("b", "send_invoice")
    worker("w-1", ["send_invoice"])
    client = Client()
    client.force_login(make_user("viewer", *VIEW_ALL))
    html = client.get(dashboard_url()).content.decode()
    table = re.search(r'<table class="leasing-table" id="leasing-queue-table">(.*?)</table>',
                      html, re.S).group(1)  # fmt: skip
    orphan = re.search(r'<tr class="leasing-row-bad"[^>]*data-work-type="orphan_type"', table)
    assert orphan and "none: no live worker serves it" in table
    assert not re.search(r'<tr class="leasing-row-bad"[^>]*data-work-type="send_invoice"', table)
    tile = re.search(
        r'leasing-tile-bad" href="#leasing-queues">\s*<span class="leasing-tile-label">'
        r'Unserved work.*?<span class="leasing-tile-value">(\d+)</span>',
        html,
        re.S,
    )
    assert tile and tile.group(1) == "1"


def test_histogram_percentiles_interpolate_like_postgresql_within_six_percent():
    def histogram(values: list[float]) -> dict[int, int]:
        counts: dict[int, int] = {}
        for value in values:
            counts[bucket_of(value)] = counts.get(bucket_of(value), 0) + 1
        return counts

    def exact(ordered: list[float], fraction: float) -> float:
        position = fraction * (len(ordered) - 1)
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    assert histogram_percentile({}, 0.5) is None
    assert histogram_percentile(histogram([5.0]), 0.95) == pytest.approx(5.0, rel=0.06)
    assert histogram_percentile(histogram([1.0, 2.0]), 0.5) == pytest.approx(1.5, rel=0.06)
    spread = sorted([0.0004, 0.003, 0.02, 0.5, 0.9, 1.7, 2.2, 30.0, 61.0, 3600.0] * 3)
    for fraction in (0.0, 0.1, 0.5, 0.9, 0.95, 0.99, 1.0):
        got = histogram_percentile(histogram(spread), fraction)
        want = exact(spread, fraction)
        # Under the first edge (1 ms) a run counts as half of it.
        assert got == pytest.approx(want, rel=0.06, abs=0.0005), fraction


def test_metrics_report_queues_unserved_work_silent_processes_and_run_times(leasing_settings):
    from prometheus_client.parser import text_string_to_metric_families

    leasing_settings(METRICS_TOKEN="t0ken")
    enqueue("a", "orphan_type")
    enqueue("b", "send_invoice", queue_name="billing")
    worker("w-1", ["send_invoice"])
    worker("w-dead", ["sync"], heartbeat_interval=1)
    Worker.objects.filter(pk="w-dead").update(last_seen_at=database_now() - timedelta(seconds=10))
    for n, seconds in enumerate((1, 3)):
        finished(f"ok{n}", "resize", seconds)
    body = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken").content.decode()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    orphan = (("queue", "default"), ("work_type", "orphan_type"))
    served = (("queue", "billing"), ("work_type", "send_invoice"))
    assert values[("leasing_queue_pending", orphan)] == 1
    assert values[("leasing_queue_unserved", orphan)] == 1
    assert values[("leasing_queue_unserved", served)] == 0
    assert values[("leasing_processes_silent", (("role", "worker"),))] == 1
    # Read from a run-time histogram: within 6%.
    assert values[("leasing_run_seconds", (("quantile", "0.5"), ("work_type", "resize")))] == (
        pytest.approx(2.0, rel=0.06)
    )
    assert values[("leasing_leases_near_cap", ())] == 0
