"""History and lease analytics: run-time percentiles over time, rates, per worker, peak hours."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from leasing import LeaseManager, RecoverySweep
from leasing.console.backlog import throughput
from leasing.console.history import analytics, run_durations
from leasing.console.windows import bucket_bounds
from leasing.models import FinishedHour, Worker, WorkItem
from leasing.services.rollups import floor_hour, roll_up_finished_hours
from tests.support.admin import VIEW_ALL, claim, make_user, shift
from tests.support.helpers import database_now
from tests.support.transition_guard import arranging

pytestmark = pytest.mark.django_db

HISTORY_URL = "/admin/leasing/workitem/history/"


def completed(task_id: str, work_type: str, run_seconds: float, ended_ago: float = 5) -> str:
    lease = claim(task_id, "w-1", work_type=work_type)
    LeaseManager("w-1").release_lease(lease.work_item_id, True, token=lease.token)
    shift(lease.work_item_id, lease_acquired_at=-(run_seconds + ended_ago),
          completed_at=-ended_ago)  # fmt: skip
    return lease.work_item_id


def test_run_time_percentiles_per_type_and_bucket():
    for n, seconds in enumerate((1, 2, 3, 4, 10)):
        completed(f"a{n}", "resize", seconds)
    completed("b0", "report", 30)
    completed("old", "resize", 500, ended_ago=7200)  # another hour bucket of the day
    now = database_now()
    series = {s.work_type: s for s in run_durations(window_minutes=1440, now=now)}
    assert set(series) == {"resize", "report"}
    latest = series["resize"].points[-1]
    assert latest.count == 5
    # percentile_cont gives 3.0 and 8.8; the histograms the same within 6%.
    assert latest.p50 == pytest.approx(3.0, rel=0.06)
    assert latest.p95 == pytest.approx(8.8, rel=0.06)
    assert [p.count for p in series["resize"].points] == [1, 5]
    assert series["report"].points[0].p50 == pytest.approx(30.0, rel=0.06)
    # The last hour holds only the five recent ones.
    hour = {s.work_type: s for s in run_durations(window_minutes=60, now=now)}
    assert sum(p.count for p in hour["resize"].points) == 5


def test_a_week_of_throughput_in_six_hour_buckets():
    completed("recent", "resize", 1)
    done = completed("three-days-ago", "resize", 1, ended_ago=3 * 86400)
    now = database_now()
    start, step, count = bucket_bounds(10080, now)
    assert (step, count) == (timedelta(hours=6), 28)
    assert start.hour % 6 == 0 and start.minute == 0 and start < now <= start + 28 * step
    week = throughput(window_minutes=10080, now=now)
    assert (len(week.buckets), week.completed) == (28, 2)
    ended = WorkItem.objects.get(pk=done).completed_at
    [hit] = [b for b in week.buckets if b.start <= ended < b.start + step]
    assert hit.completed == 1


def test_lease_analytics(leasing_settings):
    leasing_settings(HEARTBEAT_INTERVAL=10)
    for n, seconds in enumerate((2, 4)):
        completed(f"c{n}", "resize", seconds)
    fresh = claim("fresh", "w-2")
    quiet = claim("quiet", "w-2")
    shift(quiet.work_item_id, heartbeat_at=-90)
    capped = claim("capped", "w-3")
    shift(capped.work_item_id, lease_deadline_at=60)
    gone = claim("gone", "w-4")
    shift(gone.work_item_id, lease_expires_at=-5)
    RecoverySweep(scan_interval_seconds=5).scan_and_recover()
    Worker.objects.create(worker_id="w-1", hostname="h", pid=1, items_completed=40, items_failed=2)
    Worker.objects.create(worker_id="w-2", hostname="h", pid=2, items_completed=90)

    now = database_now()
    stats = analytics(window_minutes=60, now=now)
    assert (stats.completed, stats.failed) == (2, 0)
    assert stats.average_lease_seconds == pytest.approx(3.0, abs=0.01)
    assert stats.expirations == 1 and stats.expiration_rate == pytest.approx(1 / 3)
    assert stats.live_leases == 3 and stats.renewed_last_minute == 2  # not "quiet"
    assert stats.near_cap == 1
    assert [(w.worker_id, w.total) for w in stats.per_worker] == [("w-2", 90), ("w-1", 42)]
    local = timezone.localtime(WorkItem.objects.get(task_id="c0").completed_at)
    assert stats.peak[local.isoweekday() - 1][local.hour] == 2
    assert sum(map(sum, stats.peak)) == 2
    assert fresh.work_item_id  # claimed, live, renewed just now


def test_history_page_and_fragments():
    completed("a", "resize", 2)
    client = Client()
    client.force_login(make_user("viewer", *VIEW_ALL))
    for window in ("60", "1440", "10080", "bad"):
        html = client.get(HISTORY_URL, {"window": window}).content.decode()
        for chart in ("leasing-throughput-chart", "leasing-duration-chart", "leasing-heat-map"):
            assert f'id="{chart}"' in html, (window, chart)
        assert 'id="leasing-analytics"' in html
    fragment = client.get(HISTORY_URL, HTTP_X_LEASING_FRAGMENT="1")
    assert "<html" not in fragment.content.decode()
    assert 'data-leasing-panel="charts"' in fragment.content.decode()
    assert "X-Leasing-Fragment" in fragment["Vary"]
    dashboard = client.get("/admin/leasing/workitem/dashboard/", HTTP_X_LEASING_FRAGMENT="1")
    panels = dashboard.content.decode()
    assert "<html" not in panels and 'data-leasing-panel="queues"' in panels


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "America/St_Johns"])
@pytest.mark.parametrize("rolled_up", [False, True], ids=["recent", "rolled-up"])
def test_peak_hours_fold_into_the_local_weekday_and_hour_of_any_offset(zone, rolled_up):
    # Kolkata is UTC+5:30 and St John's UTC-3:30 in November: a quarter hour
    # either side of a local midnight or hour must land in the right cell,
    # whether the week is read from the items or from the hourly rollup.
    now = database_now()
    anchor = floor_hour(now - timedelta(days=3))
    moments = [
        anchor + timedelta(minutes=40),
        anchor + timedelta(minutes=20),
        anchor - timedelta(hours=30, minutes=-25),
        anchor - timedelta(hours=30, minutes=-35),
        anchor - timedelta(days=2, minutes=5),
    ]
    for n, moment in enumerate(moments):
        item = WorkItem.objects.create(task_id=f"peak-{n}", work_type="resize")
        with arranging():
            WorkItem.objects.filter(pk=item.pk).update(status="completed", completed_at=moment)
    too_old = WorkItem.objects.create(task_id="peak-old", work_type="resize")
    with arranging():
        WorkItem.objects.filter(pk=too_old.pk).update(
            status="completed", completed_at=now - timedelta(days=8)
        )
    if rolled_up:
        roll_up_finished_hours(max_hours=24 * 9)
        # The first pass reaches back 8 days: the moments and the one too old for the week.
        assert sum(FinishedHour.objects.values_list("items", flat=True)) == len(moments) + 1
        WorkItem.objects.filter(task_id__startswith="peak-").delete()  # read from the rollup only
    with timezone.override(zone):
        grid = analytics(window_minutes=60, now=now).peak
        expected = [[0] * 24 for _ in range(7)]
        for moment in moments:
            local = timezone.localtime(moment)
            expected[local.isoweekday() - 1][local.hour] += 1
    assert [list(day) for day in grid] == expected
    assert sum(map(sum, grid)) == len(moments)


@pytest.mark.parametrize("window", ["60", "1440"])
def test_history_narrowed_to_a_queue_and_a_work_type(window):
    completed("r1", "resize", 1)
    completed("r2", "resize", 2)
    completed("p1", "report", 3)
    lease = claim("media-1", "w-1", work_type="resize", queue_name="media")
    LeaseManager("w-1").release_lease(lease.work_item_id, True, token=lease.token)
    client = Client()
    client.force_login(make_user("viewer", *VIEW_ALL))

    def finished(query: dict[str, str]) -> str:
        response = client.get(HISTORY_URL, {"window": window, **query})
        assert response.status_code == 200
        return response.context["stats"].completed

    assert finished({}) == 4
    assert finished({"work_type": "resize"}) == 3
    assert finished({"work_type": "report"}) == 1
    assert finished({"queue": "media"}) == 1
    assert finished({"queue": "default", "work_type": "resize"}) == 2
    html = client.get(HISTORY_URL, {"queue": "media"}).content.decode()
    assert 'id="leasing-narrowed">queue media only' in html


def test_an_unknown_queue_is_ignored_with_the_pages_message_and_the_window_kept():
    completed("r1", "resize", 1)
    client = Client()
    client.force_login(make_user("viewer", *VIEW_ALL))
    response = client.get(HISTORY_URL, {"queue": "nope", "window": "1440"})
    html = response.content.decode()
    assert 'id="leasing-ignored"' in html and "queue=nope" in html
    assert response.context["window_label"] == "24 h"
    assert response.context["stats"].completed == 1
