"""History and lease analytics: run times over time, expirations, renewals, peak hours.

Read-only, each query bounded by its window and shaped for an index:

* run times per work type and bucket: `work_items_finished_idx` (index-only),
  percentiles in SQL on PostgreSQL, in Python over at most
  `SQLITE_DURATION_ROWS` rows on SQLite;
* expirations: the sweep's `error_boundary` checkpoints of the window
  (`checkpoints_type_idx`, then each row's small `metadata`);
* renewals: live leases whose heartbeat moved in the last minute (the
  `in_progress` partial index);
* peak hours: completions of the last 7 days by weekday and hour of day, in
  the site's time zone, from the hourly rollup (`console.finished`);
* a day or a week window: every finished figure from the same groups.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections
from django.db.models import Avg, Count, F, Q
from django.db.models.functions import Now
from django.utils import timezone

from ..models import Checkpoint, CheckpointType, Worker, WorkItem, WorkItemStatus
from .backlog import THROUGHPUT_WINDOWS, bucket_bounds
from .finished import (
    FinishedGroup,
    FinishedWindow,
    finished_window,
    histogram_percentile,
    is_rolled,
    merge,
    per_bucket,
)
from .leases import lease_health
from .queues import percentile

HISTORY_WINDOWS = (60, 1440, 10080)  # 1 h, 24 h, 7 d
SQLITE_DURATION_ROWS = 50_000
PEAK_DAYS = 7
NEAR_CAP_SECONDS = 300
WORKERS_SHOWN = 20
QUARTER = timedelta(minutes=15)


@dataclass(frozen=True, slots=True)
class DurationPoint:
    start: datetime
    count: int
    p50: float
    p95: float


@dataclass(frozen=True, slots=True)
class DurationSeries:
    """Run time (last attempt of completed items) of one work type, per bucket with data."""

    work_type: str
    points: tuple[DurationPoint, ...]


def run_durations(
    *,
    window_minutes: int,
    now: datetime,
    using: str = "default",
    finished: FinishedWindow | None = None,
) -> tuple[DurationSeries, ...]:
    """Per work type and bucket; from `finished` (a day or a week's groups) when given."""
    start, step, count = bucket_bounds(window_minutes, now)
    if finished is not None:
        rows = _durations_from_groups(finished, start, step, count)
    elif connections[using].vendor == "postgresql":
        rows = _durations_postgres(start, step, using)
    else:
        rows = _durations_python(start, step, using)
    series: dict[str, list[DurationPoint]] = defaultdict(list)
    for work_type, bucket_start, count, p50, p95 in sorted(rows):
        series[work_type].append(DurationPoint(bucket_start, count, p50, p95))
    return tuple(DurationSeries(t, tuple(points)) for t, points in sorted(series.items()))


def _durations_from_groups(
    finished: FinishedWindow, start: datetime, step: timedelta, count: int
) -> list[tuple[str, datetime, int, float, float]]:
    rows = []
    for index, groups in per_bucket(finished.groups, start, step, count).items():
        by_type: dict[str, list[FinishedGroup]] = defaultdict(list)
        for group in groups:
            by_type[group.work_type].append(group)
        for work_type, typed in by_type.items():
            histogram = merge(g.run_histogram for g in typed)
            p50, p95 = histogram_percentile(histogram, 0.5), histogram_percentile(histogram, 0.95)
            if p50 is not None and p95 is not None:
                timed = sum(histogram.values())
                rows.append((work_type, start + index * step, timed, p50, p95))
    return rows


_DURATIONS_SQL = """
SELECT work_type, floor(extract(epoch FROM completed_at - %(start)s) / %(step)s) AS bucket,
       count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM run)),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM run))
FROM (SELECT work_type, completed_at, completed_at - lease_acquired_at AS run
      FROM work_items
      WHERE completed_at >= %(start)s AND status = %(completed)s
        AND lease_acquired_at IS NOT NULL) AS finished
GROUP BY 1, 2
"""


def _durations_postgres(
    start: datetime, step: timedelta, using: str
) -> list[tuple[str, datetime, int, float, float]]:
    params = {
        "start": start,
        "step": step.total_seconds(),
        "completed": WorkItemStatus.COMPLETED.value,
    }
    with connections[using].cursor() as cursor:
        cursor.execute(_DURATIONS_SQL, params)
        return [
            (work_type, start + int(bucket) * step, count, float(p50), float(p95))
            for work_type, bucket, count, p50, p95 in cursor.fetchall()
        ]


def _durations_python(
    start: datetime, step: timedelta, using: str
) -> list[tuple[str, datetime, int, float, float]]:
    grouped: dict[tuple[str, int], list[float]] = defaultdict(list)
    rows = (
        WorkItem.objects.using(using)
        .completed()
        .filter(completed_at__gte=start, lease_acquired_at__isnull=False)
        .order_by("-completed_at")
        .values_list("work_type", "completed_at", "lease_acquired_at")[:SQLITE_DURATION_ROWS]
    )
    for work_type, completed_at, acquired_at in rows:
        bucket = int((completed_at - start) // step)
        grouped[(work_type, bucket)].append((completed_at - acquired_at).total_seconds())
    result = []
    for (work_type, bucket), values in grouped.items():
        values.sort()
        p50, p95 = percentile(values, 0.5), percentile(values, 0.95)
        result.append((work_type, start + bucket * step, len(values), p50, p95))
    return result


# --- lease analytics -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerShare:
    worker_id: str
    status: str
    completed: int
    failed: int

    @property
    def total(self) -> int:
        return self.completed + self.failed


@dataclass(frozen=True, slots=True)
class Analytics:
    window_minutes: int
    completed: int
    failed: int
    average_lease_seconds: float | None  # completed items, last attempt
    expirations: int  # leases the sweep recovered in the window
    live_leases: int
    renewed_last_minute: int
    no_progress: int
    expired_awaiting_sweep: int
    near_cap: int  # live leases within NEAR_CAP_SECONDS of their hard cap
    per_worker: tuple[WorkerShare, ...]
    peak: tuple[tuple[int, ...], ...]  # [weekday 0=Monday][hour] completions, last 7 days

    @property
    def expirations_per_hour(self) -> float:
        return self.expirations * 60 / self.window_minutes

    @property
    def expiration_rate(self) -> float | None:
        """Expired leases among the attempts that ended in the window."""
        ended = self.completed + self.failed + self.expirations
        return None if ended == 0 else self.expirations / ended

    @property
    def renewal_rate(self) -> float | None:
        """Share of live leases renewed in the last minute."""
        return None if self.live_leases == 0 else self.renewed_last_minute / self.live_leases

    @property
    def stuck(self) -> int:
        return self.no_progress + self.expired_awaiting_sweep + self.near_cap


def analytics(
    *,
    window_minutes: int,
    now: datetime,
    using: str = "default",
    week: FinishedWindow | None = None,
) -> Analytics:
    """The window's lease analytics; peak hours over the last week.

    `week`: the last week's finished groups (`console.finished`) when the
    caller has read them; a day or a week window takes its finished figures
    from them too.
    """
    if window_minutes not in THROUGHPUT_WINDOWS:
        raise ValueError(f"window_minutes must be one of {sorted(THROUGHPUT_WINDOWS)}")
    start = now - timedelta(minutes=window_minutes)
    if week is None:
        week = finished_window(now - timedelta(days=PEAK_DAYS), using=using)
    items = WorkItem.objects.using(using).order_by()
    if is_rolled(window_minutes):
        part = week.since(start)
        finished = {
            "completed": part.count(WorkItemStatus.COMPLETED),
            "failed": part.count(WorkItemStatus.FAILED),
            "average_seconds": part.average_run_seconds(),
        }
    else:
        completed = Q(status=WorkItemStatus.COMPLETED)
        counted = items.filter(completed_at__gte=start).aggregate(
            completed=Count("status", filter=completed),
            failed=Count("status", filter=Q(status=WorkItemStatus.FAILED)),
            average=Avg(F("completed_at") - F("lease_acquired_at"), filter=completed),
        )
        average = counted.pop("average")
        finished = {
            **counted,
            "average_seconds": None if average is None else average.total_seconds(),
        }
    health = lease_health(using=using)
    renewed = (
        items.in_progress()
        .filter(lease_expires_at__gte=Now(), heartbeat_at__gte=Now() - timedelta(minutes=1))
        .count()
    )
    expirations = (
        Checkpoint.objects.using(using)
        .filter(
            checkpoint_type=CheckpointType.ERROR_BOUNDARY,
            created_at__gte=start,
            metadata__source="recovery_sweep",
        )
        .count()
    )
    return Analytics(
        window_minutes=window_minutes,
        completed=finished["completed"],
        failed=finished["failed"],
        average_lease_seconds=finished["average_seconds"],
        expirations=expirations,
        live_leases=health.healthy + health.stale_live,
        renewed_last_minute=renewed,
        no_progress=health.no_progress,
        expired_awaiting_sweep=health.expired,
        near_cap=leases_near_cap(using=using),
        per_worker=_per_worker(using),
        peak=_peak_hours(week),
    )


def leases_near_cap(*, using: str = "default") -> int:
    """Live leases within `NEAR_CAP_SECONDS` of their hard cap (`lease_deadline_at`)."""
    return (
        WorkItem.objects.using(using)
        .in_progress()
        .filter(
            lease_expires_at__gte=Now(),
            lease_deadline_at__lt=Now() + timedelta(seconds=NEAR_CAP_SECONDS),
        )
        .count()
    )


def _per_worker(using: str) -> tuple[WorkerShare, ...]:
    """Items finished per worker process (its counters since it started), busiest first."""
    rows = (
        Worker.objects.using(using)
        .workers()
        .order_by(F("items_completed").desc(), "worker_id")
        .values_list("worker_id", "status", "items_completed", "items_failed")[:WORKERS_SHOWN]
    )
    return tuple(WorkerShare(*row) for row in rows)


def _peak_hours(week: FinishedWindow) -> tuple[tuple[int, ...], ...]:
    """Completions by local weekday and hour, from the week's hourly groups.

    Each group counts its items per quarter of the hour, and every UTC offset
    in use is a whole number of quarter hours: each quarter lies in one local
    hour.
    """
    grid = [[0] * 24 for _ in range(7)]
    zone = timezone.get_current_timezone()
    for group in week.groups:
        if group.status != WorkItemStatus.COMPLETED:
            continue
        for quarter, items in enumerate(group.quarters):
            if items:
                local = (group.hour + quarter * QUARTER).astimezone(zone)
                grid[local.isoweekday() - 1][local.hour] += items
    return tuple(tuple(day) for day in grid)
