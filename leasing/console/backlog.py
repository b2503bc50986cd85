"""The pending backlog and throughput over time (the windows: `console.windows`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Q
from django.db.models.functions import Now

from ..models import Pause, WorkItem, WorkItemStatus
from ..sql.runner import database_now, run, to_datetime
from ..states import PauseKind
from ..storage import storage_for
from .census import CompletedAndFailed, FinishedTotals
from .durations import age
from .finished import FinishedWindow, finished_for, per_bucket
from .windows import THROUGHPUT_WINDOWS, bucket_bounds

# --- backlog ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backlog:
    """Pending items: how many, how many wait for `run_after`, and the oldest claimable one."""

    pending: int
    deferred: int
    oldest_created_at: datetime | None
    oldest_age_seconds: float | None
    blocked: int = 0  # pending, waiting for dependencies (counted in `pending`)
    # Pending, due and unblocked, but of a paused queue or work type: held, not claimable.
    paused: int = 0

    @property
    def claimable(self) -> int:
        return self.pending - self.deferred - self.blocked - self.paused


Pauses = frozenset[tuple[str, str]]  # active pauses: {(kind, name)}


def active_pauses(*, using: str = "default") -> Pauses:
    """The active pauses, `{(kind, name)}` (a handful of rows)."""
    return frozenset(Pause.objects.using(using).active().values_list("kind", "name"))


def is_paused(pauses: Pauses, queue_name: str, work_type: str) -> bool:
    return (PauseKind.QUEUE, queue_name) in pauses or (PauseKind.WORK_TYPE, work_type) in pauses


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
    unblocked = (
        pending.filter(dependencies_left=0)
        .values("queue_name", "work_type")
        .annotate(
            n=Count("*"),
            deferred=Count("run_after", filter=Q(run_after__gt=Now())),
            oldest=Min("created_at", filter=claimable),
        )
    )
    # Read by one process: planned parallel at a million rows (`without_parallel_workers`).
    sql, params = unblocked.query.get_compiler(using=using).as_sql()
    statement = (storage_for(using).without_parallel_workers(sql), list(params))
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for r in run(using, statement):
        r["oldest"] = to_datetime(r["oldest"])
        pairs[(r["queue_name"], r["work_type"])] = {**r, "blocked": 0}
    for b in (
        pending.filter(dependencies_left__gt=0)
        .values("queue_name", "work_type")
        .annotate(n=Count("*"))
    ):
        pair = pairs.setdefault(
            (b["queue_name"], b["work_type"]), {"n": 0, "deferred": 0, "oldest": None}
        )
        pair["blocked"] = b["n"]
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
    pauses: Pauses | None = None,
) -> Backlog:
    """The whole backlog, summed from `pending_pairs` (read here unless given).

    The oldest *claimable* item is the one a worker should already have taken;
    items deferred by a retry backoff or a future `run_after` wait on purpose,
    items blocked by dependencies wait for those, and items of a paused queue
    or work type wait for someone to resume it: all are counted separately,
    and none of them is claimable or ages the oldest. Its age is measured from
    enqueueing.
    """
    now = now or database_now(using)
    pairs = pending_pairs(using=using) if pairs is None else pairs
    pauses = active_pauses(using=using) if pauses is None else pauses
    running = [p for p in pairs if not is_paused(pauses, p.queue_name, p.work_type)]
    held = [p for p in pairs if is_paused(pauses, p.queue_name, p.work_type)]
    oldest = min((p.oldest_claimable_at for p in running if p.oldest_claimable_at), default=None)
    return Backlog(
        pending=sum(p.pending for p in pairs),
        deferred=sum(p.deferred for p in pairs),
        oldest_created_at=oldest,
        oldest_age_seconds=age(now, oldest),
        blocked=sum(p.blocked for p in pairs),
        paused=sum(p.pending - p.deferred - p.blocked for p in held),
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


def throughput(
    *,
    window_minutes: int = 60,
    now: datetime | None = None,
    using: str = "default",
    finished: FinishedWindow | None = None,
) -> Throughput:
    """Completions and failures per bucket of the window.

    Summed from the window's finished groups (`console.finished`), read here
    unless the caller has read them for its other figures.
    """
    now = now or database_now(using)
    start, step, count = bucket_bounds(window_minutes, now)
    if finished is None:
        finished = finished_for(window_minutes=window_minutes, now=now, using=using)
    completed = [0] * count
    failed = [0] * count
    for index, groups in per_bucket(finished.groups, start, step, count).items():
        for group in groups:
            if group.status == WorkItemStatus.COMPLETED:
                completed[index] += group.items
            elif group.status == WorkItemStatus.FAILED:
                failed[index] += group.items
    return Throughput(
        window_minutes=window_minutes,
        bucket_minutes=THROUGHPUT_WINDOWS[window_minutes],
        buckets=tuple(
            ThroughputBucket(start=start + i * step, completed=completed[i], failed=failed[i])
            for i in range(count)
        ),
    )
