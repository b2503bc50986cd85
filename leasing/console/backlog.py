"""The pending backlog and throughput over time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Count, Min, Q
from django.db.models.functions import Now, TruncHour, TruncMinute

from ..models import WorkItem, WorkItemStatus
from ..sql.runner import database_now
from .census import FINISHED, CompletedAndFailed, FinishedTotals
from .durations import age
from .finished import FinishedWindow

# --- backlog ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backlog:
    """Pending items: how many, how many wait for `run_after`, and the oldest claimable one."""

    pending: int
    deferred: int
    oldest_created_at: datetime | None
    oldest_age_seconds: float | None
    blocked: int = 0  # pending, waiting for dependencies (counted in `pending`)

    @property
    def claimable(self) -> int:
        return self.pending - self.deferred - self.blocked


@dataclass(frozen=True, slots=True)
class PendingPair:
    """Pending items of one (queue, work type) pair."""

    queue_name: str
    work_type: str
    pending: int
    deferred: int  # not blocked, waiting for their run_after
    blocked: int  # waiting for dependencies
    oldest_claimable_at: datetime | None


def pending_pairs(*, using: str = "default") -> tuple[PendingPair, ...]:
    """Pending items per (queue, work type), from two index-only scans.

    The claimable ones through `work_items_claim_idx`, the ones blocked by
    dependencies through `work_items_blocked_idx`: both hold every column read
    here, so the table is not touched (pages the visibility map has not marked
    all-visible apart).
    """
    pending = WorkItem.objects.using(using).pending().order_by()
    claimable = Q(run_after__isnull=True) | Q(run_after__lte=Now())
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for r in (
        pending.filter(dependencies_left=0)
        .values("queue_name", "work_type")
        .annotate(
            n=Count("*"),
            deferred=Count("run_after", filter=Q(run_after__gt=Now())),
            oldest=Min("created_at", filter=claimable),
        )
    ):
        pairs[(r["queue_name"], r["work_type"])] = {**r, "blocked": 0}
    for r in (
        pending.filter(dependencies_left__gt=0)
        .values("queue_name", "work_type")
        .annotate(n=Count("*"))
    ):
        pair = pairs.setdefault(
            (r["queue_name"], r["work_type"]), {"n": 0, "deferred": 0, "oldest": None}
        )
        pair["blocked"] = r["n"]
    return tuple(
        PendingPair(
            queue, work_type, p["n"] + p["blocked"], p["deferred"], p["blocked"], p["oldest"]
        )
        for (queue, work_type), p in pairs.items()
    )


def backlog(
    *,
    now: datetime | None = None,
    using: str = "default",
    pairs: tuple[PendingPair, ...] | None = None,
) -> Backlog:
    """The whole backlog, summed from `pending_pairs` (read here unless given).

    The oldest *claimable* item is the one a worker should already have taken;
    items deferred by a retry backoff or a future `run_after` wait on purpose,
    and items blocked by dependencies wait for those; both are counted
    separately. Its age is measured from enqueueing.
    """
    now = now or database_now(using)
    pairs = pending_pairs(using=using) if pairs is None else pairs
    oldest = min((p.oldest_claimable_at for p in pairs if p.oldest_claimable_at), default=None)
    return Backlog(
        pending=sum(p.pending for p in pairs),
        deferred=sum(p.deferred for p in pairs),
        oldest_created_at=oldest,
        oldest_age_seconds=age(now, oldest),
        blocked=sum(p.blocked for p in pairs),
    )


# --- throughput ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThroughputBucket(CompletedAndFailed):
    start: datetime
    completed: int
    failed: int


@dataclass(frozen=True, slots=True)
class Throughput(FinishedTotals):
    """Items finished per bucket over the last `window_minutes` (by `completed_at`)."""

    window_minutes: int
    bucket_minutes: int
    buckets: tuple[ThroughputBucket, ...]

    @property
    def completed_per_minute(self) -> float:
        return self.completed / self.window_minutes if self.window_minutes else 0.0


# Window length (minutes) -> bucket length (minutes): 12 to 28 bars each.
THROUGHPUT_WINDOWS: dict[int, int] = {15: 1, 60: 5, 180: 15, 1440: 60, 10080: 360}


def bucket_bounds(window_minutes: int, now: datetime) -> tuple[datetime, timedelta, int]:
    """(start, bucket length, bucket count) of a window ending with the bucket holding `now`.

    Buckets are aligned to the bucket length from midnight (every length divides
    a day), so the bars do not shift by a few seconds at every refresh.
    """
    if window_minutes not in THROUGHPUT_WINDOWS:
        raise ValueError(
            f"window_minutes must be one of {sorted(THROUGHPUT_WINDOWS)}, got {window_minutes!r}"
        )
    bucket = THROUGHPUT_WINDOWS[window_minutes]
    floor = now.replace(second=0, microsecond=0)
    floor -= timedelta(minutes=(floor.hour * 60 + floor.minute) % bucket)
    step = timedelta(minutes=bucket)
    return floor + step - timedelta(minutes=window_minutes), step, window_minutes // bucket


# PostgreSQL groups the window's finished rows straight into its buckets
# (`date_bin`: a hash aggregate of a few dozen groups); truncating every row
# to a minute or an hour first made it sort them.
_THROUGHPUT_SQL = """
SELECT extract(epoch FROM date_bin(%(step)s, completed_at, %(start)s)), status, count(*)
FROM work_items
WHERE completed_at >= %(start)s AND status = ANY(%(finished)s)
GROUP BY 1, 2
"""


def throughput(
    *,
    window_minutes: int = 60,
    now: datetime | None = None,
    using: str = "default",
    finished: FinishedWindow | None = None,
) -> Throughput:
    """Completions and failures per bucket, from `work_items_finished_idx` (index-only).

    `finished`: the window's groups when the caller has read them (a day or a
    week: the hourly rollup, `console.finished`); the buckets are then summed
    from those.
    """
    now = now or database_now(using)
    start, step, count = bucket_bounds(window_minutes, now)
    completed = [0] * count
    failed = [0] * count
    if finished is not None:
        rows = [(g.hour, g.status, g.items) for g in finished.groups]
    else:
        rows = _finished_per_bucket(start, step, window_minutes, using)
    for bucket_start, status, n in rows:
        index = int((bucket_start - start) // step)
        if 0 <= index < count:
            target = completed if status == WorkItemStatus.COMPLETED else failed
            target[index] += n
    return Throughput(
        window_minutes=window_minutes,
        bucket_minutes=THROUGHPUT_WINDOWS[window_minutes],
        buckets=tuple(
            ThroughputBucket(start=start + i * step, completed=completed[i], failed=failed[i])
            for i in range(count)
        ),
    )


def _finished_per_bucket(
    start: datetime, step: timedelta, window_minutes: int, using: str
) -> list[tuple[datetime, str, int]]:
    """(bucket or sub-bucket start, status, count) of the items finished since `start`."""
    if connections[using].vendor == "postgresql":
        params = {"step": step, "start": start, "finished": list(FINISHED)}
        with connections[using].cursor() as cursor:
            cursor.execute(_THROUGHPUT_SQL, params)
            return [
                (datetime.fromtimestamp(float(epoch), tz=UTC), status, n)
                for epoch, status, n in cursor.fetchall()
            ]
    # SQLite: per minute (per hour for hour-long buckets), folded by the caller.
    truncate = TruncHour if THROUGHPUT_WINDOWS[window_minutes] >= 60 else TruncMinute
    rows = (
        WorkItem.objects.using(using)
        .filter(completed_at__gte=start, status__in=FINISHED)
        .annotate(minute=truncate("completed_at", tzinfo=UTC))  # buckets are UTC-aligned
        .order_by()
        .values("minute", "status")
        .annotate(n=Count("*"))
    )
    return [(row["minute"], row["status"], row["n"]) for row in rows]
