"""History and lease analytics: run times over time, expirations, renewals, peak hours.

Read-only, each query bounded by its window and shaped for an index:

* finished counts, average run time, and run times per work type and
  bucket: the window's finished groups (`console.finished`), percentiles
  from their histograms;
* expirations: the sweep's `error_boundary` checkpoints of the window
  (`checkpoints_type_idx`, then each row's small `metadata`);
* renewals: live leases whose heartbeat moved in the last minute (the
  `in_progress` partial index);
* peak hours: completions of the last 7 days by weekday and hour of day, in
  the site's time zone, from the week's groups (the hourly rollup).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from ..models import Checkpoint, CheckpointType, Worker, WorkItem, WorkItemStatus
from ..services.rollups import FinishedGroup
from .finished import (
    FinishedWindow,
    finished_for,
    finished_window,
    histogram_percentile,
    merge,
    per_bucket,
)
from .leases import lease_health
from .windows import THROUGHPUT_WINDOWS, bucket_bounds

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
    """Per work type and bucket, from the window's finished groups (read here unless given)."""
    start, step, count = bucket_bounds(window_minutes, now)
    if finished is None:
        finished = finished_for(window_minutes=window_minutes, now=now, using=using)
    rows = _durations_from_groups(finished, start, step, count)
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
    finished: FinishedWindow | None = None,
) -> Analytics:
    """The window's lease analytics; peak hours over the last week.

    `week`: the last week's finished groups (`console.finished`), `finished`
    the window's, each read here unless the caller has read it.
    """
    if window_minutes not in THROUGHPUT_WINDOWS:
        raise ValueError(f"window_minutes must be one of {sorted(THROUGHPUT_WINDOWS)}")
    start = now - timedelta(minutes=window_minutes)
    if week is None:
        week = finished_window(now - timedelta(days=PEAK_DAYS), using=using)
    if finished is None:
        finished = finished_for(window_minutes=window_minutes, now=now, using=using, week=week)
    items = WorkItem.objects.using(using).order_by()
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
        completed=finished.count(WorkItemStatus.COMPLETED),
        failed=finished.count(WorkItemStatus.FAILED),
        average_lease_seconds=finished.average_run_seconds(),
        expirations=expirations,
        live_leases=health.active - health.expired,  # at-risk leases are live too
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
                local = (group.start + quarter * QUARTER).astimezone(zone)
                grid[local.isoweekday() - 1][local.hour] += items
    return tuple(tuple(day) for day in grid)
