"""The hourly rollup of finished items: written by the sweep, read by the day and week windows."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test import Client

from leasing import RecoverySweep
from leasing.console.backlog import throughput
from leasing.console.census import retry_distribution
from leasing.console.dashboard import build_dashboard
from leasing.console.finished import finished_window
from leasing.console.history import analytics, run_durations
from leasing.exceptions import InvalidInput
from leasing.models import FinishedHour, WorkItem
from leasing.services.rollups import (
    GRACE,
    HOUR,
    KEEP,
    MAX_HOURS_PER_PASS,
    QUARTER,
    ROLLUP,
    ceil_hour,
    finished_groups,
    floor_hour,
    floor_quarter,
    roll_up_finished_hours,
    rollup_mark,
)
from leasing.sql import marks
from leasing.sql.rollups import bucket_of
from leasing.sql.runner import database_now, run
from leasing.storage import storage_for
from tests.support.admin import VIEW_ALL, make_user
from tests.support.transition_guard import arranging

pytestmark = pytest.mark.django_db


def exact_percentile(ordered: list[float], fraction: float) -> float:
    """PostgreSQL's percentile_cont: linear interpolation between the closest ranks."""
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def finish(
    task_id: str,
    ended: timedelta,
    *,
    run_seconds: float | None = 2.0,
    status: str = "completed",
    retries: int = 0,
    work_type: str = "resize",
    queue_name: str = "default",
) -> WorkItem:
    """An item that finished `ended` ago after running `run_seconds` (None: never leased)."""
    now = database_now()
    item = WorkItem.objects.create(task_id=task_id, work_type=work_type, queue_name=queue_name)
    with arranging():
        WorkItem.objects.filter(pk=item.pk).update(
            status=status,
            completed_at=now - ended,
            lease_acquired_at=None
            if run_seconds is None
            else now - ended - timedelta(seconds=run_seconds),
            retry_count=retries,
        )
    return item


def test_the_rollup_folds_each_closed_hour_once():
    now = database_now()
    closed = floor_quarter(now - GRACE)
    two_hours_back = floor_hour(closed) - timedelta(hours=2)
    # Two completed items and one failure in the hour two hours back, one in the current hour.
    ended = [now - (two_hours_back + timedelta(minutes=m)) for m in (5, 50)]
    finish("a", ended[0], run_seconds=1.0, retries=0)
    finish("b", ended[1], run_seconds=3.0, retries=2)
    finish("c", ended[1], run_seconds=None, status="failed", retries=3)
    finish("now", timedelta(seconds=0))

    result = roll_up_finished_hours(max_hours=24 * 9)
    assert result.through == closed == rollup_mark()
    rows = {(r.hour, r.status): r for r in FinishedHour.objects.all()}
    assert set(rows) == {(two_hours_back, "completed"), (two_hours_back, "failed")}
    done = rows[(two_hours_back, "completed")]
    assert (done.items, done.timed, done.run_seconds) == (2, 2, pytest.approx(4.0, abs=0.01))
    assert done.retries == {"0": 1, "2": 1}
    assert done.quarters == [1, 0, 0, 1]
    # The database put each run time in the bucket Python's scale gives it.
    assert done.run_histogram == {str(bucket_of(1.0)): 1, str(bucket_of(3.0)): 1}
    failed = rows[(two_hours_back, "failed")]
    assert (failed.items, failed.timed, failed.retries) == (1, 0, {"3": 1})

    # Nothing new has closed: the next pass reads the mark and writes nothing.
    again = roll_up_finished_hours()
    assert (again.hours, again.rows, again.through) == (0, 0, closed)
    assert FinishedHour.objects.count() == 2


def test_short_buckets_place_their_items_in_the_quarter_of_the_hour_they_finished_in():
    now = database_now()
    hour = floor_hour(now) - timedelta(hours=2)
    for minute in (1, 14, 15, 29, 44, 45, 59):
        finish(f"q{minute}", now - (hour + timedelta(minutes=minute, seconds=30)))
    # Five-minute buckets from the hour: each lies in one quarter, read per bucket on
    # PostgreSQL; the whole hour's bucket counts its quarters item by item.
    buckets = finished_groups(hour, hour + HOUR, step=timedelta(minutes=5), origin=hour)
    [whole] = finished_groups(hour, hour + HOUR)
    by_quarter = [0, 0, 0, 0]
    for group in buckets:
        [quarter] = [q for q, n in enumerate(group.quarters) if n]
        assert group.quarters[quarter] == group.items
        assert quarter == (group.start - hour) // timedelta(minutes=15)
        by_quarter[quarter] += group.items
    assert by_quarter == list(whole.quarters) == [2, 2, 1, 2]


def test_the_hour_of_the_mark_is_rolled_up_to_it_and_written_again_whole():
    now = database_now()
    mark = floor_quarter(now - GRACE)
    for minute in range(80):
        finish(f"m{minute}", timedelta(minutes=minute, seconds=30))

    def rolled_since(hour):
        return sum(FinishedHour.objects.filter(hour__gte=hour).values_list("items", flat=True))

    def items(start, end):
        return WorkItem.objects.filter(completed_at__gte=start, completed_at__lt=end).count()

    assert roll_up_finished_hours(max_hours=24 * 9).through == mark == rollup_mark()
    hour = floor_hour(mark - QUARTER)
    assert rolled_since(hour) == items(hour, mark)
    # The mark a quarter back (a pass that has not run yet): the next pass
    # reads the hour it is in again from its start and counts nothing twice.
    run("default", marks.set_mark(storage_for(), ROLLUP, mark - QUARTER))
    again = roll_up_finished_hours(max_hours=24 * 9)
    assert (again.through, again.hours) == (mark, 1)
    assert rolled_since(hour) == items(hour, mark)
    window = finished_window(now - timedelta(days=1))
    assert window.count("completed") == items(window.start, now + timedelta(seconds=1)) == 80


def test_a_first_pass_reaches_back_a_bounded_number_of_hours_and_prunes_old_rows():
    old = FinishedHour.objects.create(
        hour=floor_hour(database_now() - KEEP - timedelta(days=1)),
        queue_name="default",
        work_type="resize",
        status="completed",
        items=7,
    )
    first = roll_up_finished_hours(max_hours=10)
    assert first.hours == 10
    assert not FinishedHour.objects.filter(pk=old.pk).exists()
    second = roll_up_finished_hours(max_hours=10)
    assert second.through == first.through + timedelta(hours=10)
    with pytest.raises(InvalidInput):
        roll_up_finished_hours(max_hours=0)


def test_a_window_reads_rolled_hours_even_after_their_items_are_purged():
    finish("rolled", timedelta(hours=3))
    roll_up_finished_hours(max_hours=24 * 9)
    WorkItem.objects.filter(task_id="rolled").delete()  # as purgeitems would
    finish("recent", timedelta(seconds=1), status="failed", retries=1)
    window = finished_window(database_now() - timedelta(days=1))
    assert window.rolled_through == rollup_mark()
    assert (window.count("completed"), window.count("failed")) == (1, 1)
    assert window.retries().counts() == {0: 1, 1: 1}


def test_a_window_without_a_rollup_reads_the_items():
    finish("a", timedelta(hours=5))
    finish("b", timedelta(days=2))  # outside the day
    window = finished_window(database_now() - timedelta(days=1))
    assert window.rolled_through is None
    assert window.count("completed") == 1


def test_day_and_week_figures_from_the_rollup_match_the_items():
    runs = [0.2 * (n + 1) for n in range(60)]  # 0.2 s .. 12 s
    for n, seconds in enumerate(runs):
        finish(f"r{n}", timedelta(minutes=7 * n), run_seconds=seconds, retries=n % 3,
               work_type="resize" if n % 4 else "report")  # fmt: skip
    for n in range(5):
        finish(f"f{n}", timedelta(minutes=50 * n + 3), run_seconds=None, status="failed")
    roll_up_finished_hours(max_hours=24 * 9)
    now = database_now()
    assert rollup_mark() is not None and rollup_mark() > now - timedelta(hours=1)

    data = build_dashboard(window_minutes=1440)
    start = ceil_hour(data.now - timedelta(days=1))
    assert data.rolled_from == start
    exact = WorkItem.objects.filter(completed_at__gte=start)
    rows = {q.work_type: q for q in data.queues}
    for work_type in ("resize", "report"):
        of_type = exact.filter(work_type=work_type)
        assert rows[work_type].completed == of_type.filter(status="completed").count()
        assert rows[work_type].failed == of_type.filter(status="failed").count()
        runs_of_type = sorted(
            (i.completed_at - i.lease_acquired_at).total_seconds()
            for i in of_type.filter(status="completed")
        )
        for fraction, value in (
            (0.5, rows[work_type].p50_seconds),
            (0.95, rows[work_type].p95_seconds),
        ):
            assert value == pytest.approx(exact_percentile(runs_of_type, fraction), rel=0.06)
    assert data.retries.counts() == retry_distribution(since=start).counts()
    assert data.throughput.completed == exact.filter(status="completed").count()
    assert data.throughput.failed == exact.filter(status="failed").count()

    week = analytics(window_minutes=10080, now=now)
    assert (week.completed, week.failed) == (60, 5)
    average = sum(runs) / len(runs)
    assert week.average_lease_seconds == pytest.approx(average, rel=1e-6)
    weekly = throughput(
        window_minutes=10080, now=now, finished=finished_window(now - timedelta(days=7))
    )
    assert (weekly.completed, weekly.failed) == (60, 5)
    series = {s.work_type: s for s in run_durations(window_minutes=10080, now=now,
              finished=finished_window(now - timedelta(days=7)))}  # fmt: skip
    assert sum(p.count for p in series["resize"].points) == 45


def test_each_sweep_pass_rolls_up_the_hours_that_ended():
    finish("a", timedelta(hours=2))
    sweep = RecoverySweep(scan_interval_seconds=5)
    # A first sweep reaches back 8 days, MAX_HOURS_PER_PASS hours a pass.
    passes = [sweep.scan_and_recover() for _ in range(6)]
    assert [p.errors for p in passes] == [0] * 6
    rolled = [p.hours_rolled_up for p in passes]
    assert max(rolled) == MAX_HOURS_PER_PASS and rolled[-1] == 0
    assert FinishedHour.objects.filter(items=1).count() == 1
    assert rollup_mark() == floor_quarter(database_now() - GRACE)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_rollups_write_each_hour_once():
    for n in range(30):
        finish(f"c{n}", timedelta(minutes=30 * n + 5))
    barrier = threading.Barrier(3)
    results, errors = [], []

    def roll() -> None:
        try:
            barrier.wait()
            results.append(roll_up_finished_hours(max_hours=24 * 9))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections["default"].close()

    threads = [threading.Thread(target=roll) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(r.hours > 0 for r in results) == [False, False, True]
    rolled = sum(FinishedHour.objects.values_list("items", flat=True))
    expected = WorkItem.objects.filter(completed_at__lt=rollup_mark()).count()
    assert rolled == expected > 20
    assert connection.vendor == "postgresql"


def test_the_pages_say_where_a_day_or_a_week_is_read_from():
    finish("rolled", timedelta(hours=3), run_seconds=4.0)
    finish("recent", timedelta(seconds=1), run_seconds=4.0)
    roll_up_finished_hours(max_hours=24 * 9)
    client = Client()
    client.force_login(make_user("viewer", *VIEW_ALL))
    for url in ("/admin/leasing/workitem/history/", "/admin/leasing/workitem/dashboard/"):
        day = client.get(url, {"window": "1440"}).content.decode()
        assert "read from the hourly rollup the sweep writes" in day, url
        assert "log-scale histograms, within 6%" in day, url
        hour = client.get(url, {"window": "60"}).content.decode()
        assert "hourly rollup the sweep writes" not in hour, url
    week = client.get("/admin/leasing/workitem/history/", {"window": "10080"}).content.decode()
    # Both items, the rolled-up one and the one since the mark, in the week's tiles.
    assert "2 completed · 0 failed in the last 7 d" in week
