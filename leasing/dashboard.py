"""The numbers behind the admin dashboard, the checkpoint timeline and `/metrics`.

Views and the Prometheus collector only call this module; it only reads. Each
function returns frozen dataclasses, so a template cannot trigger a query by
walking a relation, and each query is shaped for an index (SPEC §15):

* lease health reads the `in_progress` partial index (`work_items_lease_expiry_idx`);
* items by status, the retry distribution and the claims counter come from
  index-only scans of `work_items_status_retry_idx` (retry_count, status,
  lease_token): exact counts, at the cost of reading one narrow index entry per
  row, about 80 ms per million rows on a 2-core PostgreSQL server. That is the
  one cost that grows with the table, so the dashboard reuses an expensive
  retry distribution for up to a minute and shows its age
  (`RETRY_CACHE_SECONDS`); `/metrics` always counts at scrape time;
* the pending backlog reads `work_items_claim_idx` (pending rows only);
* throughput reads `work_items_completed_idx` for the window only;
* recoveries read `checkpoints_type_idx`, a timeline the
  `(task_id, sequence_number)` unique index.

Times are compared with the database clock (SPEC §6.4), and "stale" means a
heartbeat older than `LEASING["STALE_HEARTBEAT"]` (120 s by default, the
"2 minutes" of the SPEC §13 query).

Payloads (`input_data`, `output_data`, checkpoint `snapshot_data` and
`metadata`) are loaded only when the caller passes `include_payloads=True`,
which views do only for users with the `leasing.view_payload` permission.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import connections
from django.db.models import Case, Count, F, Min, Q, Sum, When, Window
from django.db.models.functions import Now, RowNumber, TruncMinute

from .conf import get_settings
from .models import (
    Checkpoint,
    CheckpointType,
    WorkerRole,
    WorkItem,
    WorkItemStatus,
)
from .sql.runner import database_now

# --- lease health ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseHealthSummary:
    """In-progress items by the state of their lease.

    `active` and `stale` are the two columns of the first SPEC §13 query: every
    `in_progress` item, and those among them whose heartbeat is older than the
    stale threshold (expired or not). `healthy`, `stale_live` and `expired`
    split `active` into the three lease-health filters of the work item list;
    `no_progress` are healthy leases whose handler has not beaten for the
    threshold (a heartbeat thread keeps a stuck handler's lease alive).
    """

    active: int
    stale: int
    healthy: int
    stale_live: int
    expired: int
    no_progress: int
    stale_after_seconds: float


def lease_health(
    *, using: str = "default", stale_seconds: float | None = None
) -> LeaseHealthSummary:
    """One pass over the in-progress rows (the `in_progress` partial index)."""
    seconds = get_settings().stale_heartbeat if stale_seconds is None else stale_seconds
    cutoff = Now() - timedelta(seconds=seconds)
    live = Q(lease_expires_at__gte=Now())
    fresh = Q(heartbeat_at__gte=cutoff)
    no_progress = Q(progress_at__lt=cutoff) | Q(
        progress_at__isnull=True, lease_acquired_at__lt=cutoff
    )
    row = (
        WorkItem.objects.using(using)
        .in_progress()
        .aggregate(
            active=Count("*"),
            stale=Count("pk", filter=Q(heartbeat_at__lt=cutoff)),
            healthy=Count("pk", filter=live & fresh),
            stale_live=Count("pk", filter=live & Q(heartbeat_at__lt=cutoff)),
            expired=Count("pk", filter=Q(lease_expires_at__lt=Now())),
            no_progress=Count("pk", filter=live & fresh & no_progress),
        )
    )
    return LeaseHealthSummary(stale_after_seconds=seconds, **row)


# --- statuses, retries, claims --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryBucket:
    """Finished items that needed `retry_count` retries."""

    retry_count: int
    completed: int
    failed: int

    @property
    def total(self) -> int:
        return self.completed + self.failed


@dataclass(frozen=True, slots=True)
class RetryDistribution:
    """Completed vs failed items by retry count (the second SPEC §13 query, split by status)."""

    buckets: tuple[RetryBucket, ...]

    def counts(self) -> dict[int, int]:
        """`{retry_count: COUNT(*)}`: exactly the rows of the SPEC §13 query."""
        return {b.retry_count: b.total for b in self.buckets}

    @property
    def completed(self) -> int:
        return sum(b.completed for b in self.buckets)

    @property
    def failed(self) -> int:
        return sum(b.failed for b in self.buckets)

    @property
    def largest(self) -> int:
        return max((b.total for b in self.buckets), default=0)


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Exact number of work items in each status."""

    pending: int = 0
    in_progress: int = 0
    completed: int = 0
    failed: int = 0
    expired: int = 0

    def as_dict(self) -> dict[str, int]:
        return {status: getattr(self, status) for status in WorkItemStatus.values}

    @property
    def total(self) -> int:
        return sum(self.as_dict().values())


@dataclass(frozen=True, slots=True)
class ItemCensus:
    """Everything one scan of `work_items_status_retry_idx` yields."""

    statuses: StatusCounts
    retries: RetryDistribution
    claims_total: int  # SUM(lease_token): every claim adds one, nothing subtracts


def item_census(*, using: str = "default") -> ItemCensus:
    """Items by status, the retry distribution and the claims counter, in one query.

    `GROUP BY status, retry_count` with `SUM(lease_token)` reads only the
    columns of `work_items_status_retry_idx`, so PostgreSQL answers it with an
    index-only scan instead of reading the table.
    """
    rows = (
        WorkItem.objects.using(using)
        .order_by()
        .values("status", "retry_count")
        .annotate(n=Count("*"), tokens=Sum("lease_token"))
    )
    per_status: dict[str, int] = defaultdict(int)
    finished: dict[int, dict[str, int]] = defaultdict(lambda: {"completed": 0, "failed": 0})
    claims = 0
    for row in rows:
        per_status[row["status"]] += row["n"]
        claims += row["tokens"] or 0
        if row["status"] in (WorkItemStatus.COMPLETED, WorkItemStatus.FAILED):
            finished[row["retry_count"]][row["status"]] += row["n"]
    statuses = StatusCounts(**{s: per_status.get(s, 0) for s in WorkItemStatus.values})
    retries = RetryDistribution(
        tuple(
            RetryBucket(retry_count=count, completed=v["completed"], failed=v["failed"])
            for count, v in sorted(finished.items())
        )
    )
    return ItemCensus(statuses=statuses, retries=retries, claims_total=int(claims))


def retry_distribution(*, using: str = "default") -> RetryDistribution:
    """Only the finished rows (the index range for 'completed' and 'failed')."""
    rows = (
        WorkItem.objects.using(using)
        .finished()
        .order_by()
        .values("status", "retry_count")
        .annotate(n=Count("*"))
    )
    finished: dict[int, dict[str, int]] = defaultdict(lambda: {"completed": 0, "failed": 0})
    for row in rows:
        finished[row["retry_count"]][row["status"]] += row["n"]
    return RetryDistribution(
        tuple(
            RetryBucket(retry_count=count, completed=v["completed"], failed=v["failed"])
            for count, v in sorted(finished.items())
        )
    )


# The retry distribution is the one dashboard figure that reads every finished
# row (an index-only scan, about 80 ms per million rows on a 2-core server).
# Once it costs more than RETRY_CACHE_MIN_MS, the dashboard reuses it for up to
# RETRY_CACHE_SECONDS (longer than the page's 30 s refresh, so one viewer, and
# any number of them, scan at most once a minute) and says how old it is.
# Everything else on the page is read live. Set RETRY_CACHE_SECONDS = 0 to
# always recompute.
RETRY_CACHE_SECONDS = 60.0
RETRY_CACHE_MIN_MS = 50.0


@dataclass(frozen=True, slots=True)
class _CachedRetries:
    distribution: RetryDistribution
    computed_at: datetime


def _retry_cache_key(using: str) -> str:
    name = connections[using].settings_dict.get("NAME")
    return f"leasing:dashboard:retries:{using}:{name}"


def dashboard_retry_distribution(
    *, now: datetime, using: str = "default"
) -> tuple[RetryDistribution, datetime | None]:
    """The retry distribution and, when it came from the cache, when it was computed.

    `(distribution, None)` means computed by this call (exact as of now).
    """
    key = _retry_cache_key(using)
    if RETRY_CACHE_SECONDS > 0:
        hit = cache.get(key)
        if isinstance(hit, _CachedRetries):
            return hit.distribution, hit.computed_at
    started = time.perf_counter()
    distribution = retry_distribution(using=using)
    cost_ms = (time.perf_counter() - started) * 1000
    if RETRY_CACHE_SECONDS > 0 and cost_ms >= RETRY_CACHE_MIN_MS:
        cache.set(key, _CachedRetries(distribution, now), RETRY_CACHE_SECONDS)
    return distribution, None


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


def backlog(*, now: datetime | None = None, using: str = "default") -> Backlog:
    """One index-only scan of `work_items_claim_idx` (pending rows not blocked by
    dependencies), plus a count of `work_items_blocked_idx` (the blocked ones).

    The oldest *claimable* item is the one a worker should already have taken;
    items deferred by a retry backoff or a future `run_after` wait on purpose
    and are counted separately. Its age is measured from enqueueing.
    """
    now = now or database_now(using)
    claimable = Q(run_after__isnull=True) | Q(run_after__lte=Now())
    # Only columns of the claim index (created_at, run_after): counting or
    # reading anything else would fetch every pending row from the table.
    counts = (
        WorkItem.objects.using(using)
        .pending()
        .filter(dependencies_left=0)
        .aggregate(
            pending=Count("*"),
            deferred=Count("run_after", filter=Q(run_after__gt=Now())),
            oldest=Min("created_at", filter=claimable),
        )
    )
    oldest = counts["oldest"]
    age = None if oldest is None else max(0.0, (now - oldest).total_seconds())
    blocked = WorkItem.objects.using(using).blocked().count()
    return Backlog(
        pending=counts["pending"] + blocked,
        deferred=counts["deferred"],
        oldest_created_at=oldest,
        oldest_age_seconds=age,
        blocked=blocked,
    )


# --- throughput ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThroughputBucket:
    start: datetime
    completed: int
    failed: int

    @property
    def total(self) -> int:
        return self.completed + self.failed


@dataclass(frozen=True, slots=True)
class Throughput:
    """Items finished per bucket over the last `window_minutes` (by `completed_at`)."""

    window_minutes: int
    bucket_minutes: int
    buckets: tuple[ThroughputBucket, ...]

    @property
    def completed(self) -> int:
        return sum(b.completed for b in self.buckets)

    @property
    def failed(self) -> int:
        return sum(b.failed for b in self.buckets)

    @property
    def largest(self) -> int:
        return max((b.total for b in self.buckets), default=0)

    @property
    def completed_per_minute(self) -> float:
        return self.completed / self.window_minutes if self.window_minutes else 0.0


# Window length (minutes) -> bucket length (minutes): 12 to 24 bars each.
THROUGHPUT_WINDOWS: dict[int, int] = {15: 1, 60: 5, 180: 15, 1440: 60}


def throughput(
    *, window_minutes: int = 60, now: datetime | None = None, using: str = "default"
) -> Throughput:
    """Completions and failures per bucket, from the `completed_at` index.

    Rows are grouped per minute in SQL (at most `window_minutes` rows come
    back) and folded into buckets aligned to the bucket length, so the bars do
    not shift by a few seconds at every refresh.
    """
    if window_minutes not in THROUGHPUT_WINDOWS:
        raise ValueError(
            f"window_minutes must be one of {sorted(THROUGHPUT_WINDOWS)}, got {window_minutes!r}"
        )
    bucket = THROUGHPUT_WINDOWS[window_minutes]
    now = now or database_now(using)
    step = timedelta(minutes=bucket)
    floor = now.replace(second=0, microsecond=0)
    floor -= timedelta(minutes=floor.minute % bucket if bucket < 60 else floor.minute)
    end = floor + step
    start = end - timedelta(minutes=window_minutes)
    count = window_minutes // bucket
    completed = [0] * count
    failed = [0] * count
    rows = (
        WorkItem.objects.using(using)
        .filter(
            completed_at__gte=start, status__in=[WorkItemStatus.COMPLETED, WorkItemStatus.FAILED]
        )
        .annotate(minute=TruncMinute("completed_at"))
        .order_by()
        .values("minute", "status")
        .annotate(n=Count("*"))
    )
    for row in rows:
        index = int((row["minute"] - start) // step)
        if 0 <= index < count:
            target = completed if row["status"] == WorkItemStatus.COMPLETED else failed
            target[index] += row["n"]
    return Throughput(
        window_minutes=window_minutes,
        bucket_minutes=bucket,
        buckets=tuple(
            ThroughputBucket(start=start + i * step, completed=completed[i], failed=failed[i])
            for i in range(count)
        ),
    )


# --- the watchdog and the workers ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One row of the `workers` table, with the leases a worker holds."""

    worker_id: str
    role: str
    status: str
    hostname: str
    pid: int
    started_at: datetime
    last_seen_at: datetime
    seconds_since_seen: float
    concurrency: int
    work_types: tuple[str, ...]
    items_completed: int
    items_failed: int
    scans: int
    items_recovered: int
    last_scan_at: datetime | None
    seconds_since_scan: float | None
    last_scan_stats: dict[str, Any] | None
    lease_count: int = 0
    expired_lease_count: int = 0
    lease_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SweepHealth:
    """When the recovery sweep last ran, and whether that is too long ago.

    `ok` is False when no sweeper has ever recorded a scan, or the newest scan
    is older than two sweep intervals (the threshold after which the sweep
    itself marks a process lost): a dead watchdog must be visible.
    """

    sweepers: tuple[ProcessInfo, ...]
    last_scan_at: datetime | None
    seconds_since_last_scan: float | None
    interval_seconds: float
    threshold_seconds: float
    ok: bool
    message: str


def _age(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())


def _process(row: Any, now: datetime, **extra: Any) -> ProcessInfo:
    return ProcessInfo(
        worker_id=row.worker_id,
        role=row.role,
        status=row.status,
        hostname=row.hostname,
        pid=row.pid,
        started_at=row.started_at,
        last_seen_at=row.last_seen_at,
        seconds_since_seen=_age(now, row.last_seen_at) or 0.0,
        concurrency=row.concurrency,
        work_types=tuple(str(t) for t in (row.work_types or ())),
        items_completed=row.items_completed,
        items_failed=row.items_failed,
        scans=row.scans,
        items_recovered=row.items_recovered,
        last_scan_at=row.last_scan_at,
        seconds_since_scan=_age(now, row.last_scan_at),
        last_scan_stats=row.last_scan_stats if isinstance(row.last_scan_stats, dict) else None,
        **extra,
    )


def sweep_health(*, now: datetime | None = None, using: str = "default") -> SweepHealth:
    from .models import Worker

    now = now or database_now(using)
    interval = get_settings().sweep_interval
    threshold = 2 * interval
    rows = list(
        Worker.objects.using(using)
        .sweepers()
        .order_by(F("last_scan_at").desc(nulls_last=True), "-last_seen_at")[:20]
    )
    sweepers = tuple(_process(r, now) for r in rows)
    last = max((s.last_scan_at for s in sweepers if s.last_scan_at), default=None)
    since = _age(now, last)
    if last is None:
        ok = False
        message = (
            "No recovery sweep has ever run: expired leases are not being recovered. "
            "Start `manage.py recoverysweep` (or schedule it with django-q2)."
        )
    elif since is not None and since > threshold:
        ok = False
        message = (
            f"No recovery sweep for {_duration(since)} (more than two sweep intervals of "
            f"{_duration(interval)}): the watchdog looks dead, expired leases pile up."
        )
    else:
        ok = True
        message = f"Last sweep {_duration(since or 0.0)} ago (interval {_duration(interval)})."
    return SweepHealth(
        sweepers=sweepers,
        last_scan_at=last,
        seconds_since_last_scan=since,
        interval_seconds=interval,
        threshold_seconds=threshold,
        ok=ok,
        message=message,
    )


@dataclass(frozen=True, slots=True)
class HolderLeases:
    """Leases held by an id that has no live row in `workers` (a process that vanished)."""

    lease_holder: str
    lease_count: int
    expired_lease_count: int
    lease_ids: tuple[str, ...]


LEASE_IDS_SHOWN = 3


def live_workers(
    *, now: datetime | None = None, using: str = "default"
) -> tuple[tuple[ProcessInfo, ...], tuple[HolderLeases, ...]]:
    """Running and stopping workers with the leases they hold, and orphaned holders.

    One pass over the in-progress rows gives each holder's lease count, its
    expired leases and its first `LEASE_IDS_SHOWN` leases (soonest to expire
    first). Those rows are bounded by the workers' total concurrency, so
    numbering them with window functions is cheap.
    """
    from .models import Worker

    now = now or database_now(using)
    partition: dict[str, Any] = {"partition_by": [F("lease_holder")]}
    leases = (
        WorkItem.objects.using(using)
        .in_progress()
        .annotate(
            position=Window(
                RowNumber(),
                order_by=[F("lease_expires_at").asc(), F("work_item_id").asc()],
                **partition,
            ),
            held=Window(Count("*"), **partition),
            held_expired=Window(
                Sum(Case(When(lease_expires_at__lt=Now(), then=1), default=0)), **partition
            ),
        )
        .filter(position__lte=LEASE_IDS_SHOWN)
        .order_by("lease_holder", "position")
        .values_list("lease_holder", "work_item_id", "held", "held_expired")
    )
    per_holder: dict[str, dict[str, int]] = {}
    ids: dict[str, list[str]] = defaultdict(list)
    for holder, item_id, held, held_expired in leases:
        per_holder[holder] = {"n": held, "expired": held_expired or 0}
        ids[holder].append(item_id)
    rows = list(
        Worker.objects.using(using).workers().alive().order_by("hostname", "worker_id")[:200]
    )
    workers = []
    for row in rows:
        held = per_holder.pop(row.worker_id, None)
        workers.append(
            _process(
                row,
                now,
                lease_count=held["n"] if held else 0,
                expired_lease_count=held["expired"] if held else 0,
                lease_ids=tuple(ids.get(row.worker_id, ())),
            )
        )
    orphans = tuple(
        HolderLeases(
            lease_holder=holder,
            lease_count=row["n"],
            expired_lease_count=row["expired"],
            lease_ids=tuple(ids.get(holder, ())),
        )
        for holder, row in sorted(per_holder.items())
    )
    return tuple(workers), orphans


# --- recoveries and timelines ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """One checkpoint; `snapshot` and `metadata` are None unless payloads were requested."""

    checkpoint_id: str
    task_id: str
    work_item_id: str | None
    checkpoint_type: str
    sequence_number: int
    created_at: datetime
    snapshot: Any = None
    metadata: Any = None
    payload_included: bool = False

    @property
    def type_label(self) -> str:
        return str(CheckpointType(self.checkpoint_type).label)


def _entries(queryset: Any, include_payloads: bool) -> list[CheckpointEntry]:
    columns = [
        "checkpoint_id",
        "task_id",
        "work_item_id",
        "checkpoint_type",
        "sequence_number",
        "created_at",
    ]
    if include_payloads:
        columns += ["snapshot_data", "metadata"]
    return [
        CheckpointEntry(
            checkpoint_id=row["checkpoint_id"],
            task_id=row["task_id"],
            work_item_id=row["work_item_id"],
            checkpoint_type=row["checkpoint_type"],
            sequence_number=row["sequence_number"],
            created_at=row["created_at"],
            snapshot=row.get("snapshot_data"),
            metadata=row.get("metadata"),
            payload_included=include_payloads,
        )
        for row in queryset.values(*columns)
    ]


def recent_recoveries(
    *, limit: int = 10, include_payloads: bool = False, using: str = "default"
) -> tuple[CheckpointEntry, ...]:
    """The newest `error_boundary` checkpoints (sweep recoveries and handler errors)."""
    queryset = (
        Checkpoint.objects.using(using)
        .filter(checkpoint_type=CheckpointType.ERROR_BOUNDARY)
        .order_by("-created_at")[:limit]
    )
    return tuple(_entries(queryset, include_payloads))


@dataclass(frozen=True, slots=True)
class TaskItem:
    """A work item of the task shown above its timeline."""

    work_item_id: str
    work_type: str
    status: str
    retry_count: int
    max_retries: int
    lease_holder: str | None
    lease_token: int
    created_at: datetime
    completed_at: datetime | None

    @property
    def status_label(self) -> str:
        return str(WorkItemStatus(self.status).label)


@dataclass(frozen=True, slots=True)
class Timeline:
    """A task's checkpoints in sequence order (the newest `limit` of them)."""

    task_id: str
    entries: tuple[CheckpointEntry, ...]
    total: int
    items: tuple[TaskItem, ...]
    payloads_included: bool

    @property
    def truncated(self) -> bool:
        return self.total > len(self.entries)

    @property
    def types_present(self) -> tuple[str, ...]:
        return tuple(
            t for t in CheckpointType.values if any(e.checkpoint_type == t for e in self.entries)
        )


TIMELINE_LIMIT = 500
TASK_ITEMS_LIMIT = 50


def task_timeline(
    task_id: str,
    *,
    include_payloads: bool = False,
    limit: int = TIMELINE_LIMIT,
    using: str = "default",
) -> Timeline:
    """The task's checkpoints (the SPEC §13 timeline query) and its work items.

    Retention keeps 100 checkpoints per task by default; `limit` bounds the
    page for tasks kept longer, showing the newest ones.
    """
    checkpoints = Checkpoint.objects.using(using).filter(task_id=task_id)
    newest = checkpoints.order_by("-sequence_number")[:limit]
    entries = sorted(_entries(newest, include_payloads), key=lambda e: e.sequence_number)
    total = len(entries) if len(entries) < limit else checkpoints.count()
    items = tuple(
        TaskItem(**row)
        for row in WorkItem.objects.using(using)
        .filter(task_id=task_id)
        .order_by("-created_at", "-work_item_id")
        .values(
            "work_item_id",
            "work_type",
            "status",
            "retry_count",
            "max_retries",
            "lease_holder",
            "lease_token",
            "created_at",
            "completed_at",
        )[:TASK_ITEMS_LIMIT]
    )
    return Timeline(
        task_id=task_id,
        entries=tuple(entries),
        total=total,
        items=items,
        payloads_included=include_payloads,
    )


# --- filters of the work item list ------------------------------------------------------------


def known_work_types(*, using: str = "default", limit: int = 100) -> list[str]:
    """Work types offered by the work item list's filter, without scanning the table.

    A DISTINCT over millions of rows would cost more than the list itself, so
    the choices are the types with a handler, the types workers announce, and
    the types of in-progress and pending items (both read through partial
    indexes). Any other type still filters when typed into the URL.
    """
    from .handlers import registry
    from .models import Worker

    types: set[str] = set(registry.work_types())
    for listed in Worker.objects.using(using).values_list("work_types", flat=True)[:500]:
        types.update(str(t) for t in (listed or ()) if isinstance(t, str))
    items = WorkItem.objects.using(using)
    types.update(items.in_progress().order_by().values_list("work_type", flat=True).distinct())
    return sorted(types)[:limit]


def known_queues(*, using: str = "default", limit: int = 100) -> list[str]:
    """Queue names for the list filter (see `known_work_types` for why not DISTINCT)."""
    from .models import Worker

    queues: set[str] = {"default"}
    for listed in Worker.objects.using(using).values_list("queues", flat=True)[:500]:
        queues.update(str(q) for q in (listed or ()) if isinstance(q, str))
    items = WorkItem.objects.using(using)
    queues.update(items.in_progress().order_by().values_list("queue_name", flat=True).distinct())
    return sorted(queues)[:limit]


# --- counters for /metrics -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessCounters:
    """Sums over the `workers` table (all rows, stopped ones included)."""

    items_completed: int
    items_failed: int
    items_recovered: int
    scans: int


def process_counters(*, using: str = "default") -> ProcessCounters:
    from .models import Worker

    row = Worker.objects.using(using).aggregate(
        completed=Sum("items_completed"),
        failed=Sum("items_failed"),
        recovered=Sum("items_recovered", filter=Q(role=WorkerRole.SWEEPER)),
        scans=Sum("scans", filter=Q(role=WorkerRole.SWEEPER)),
    )
    return ProcessCounters(
        items_completed=int(row["completed"] or 0),
        items_failed=int(row["failed"] or 0),
        items_recovered=int(row["recovered"] or 0),
        scans=int(row["scans"] or 0),
    )


def processes_by_state(*, using: str = "default") -> dict[tuple[str, str], int]:
    """`{(role, status): count}` over the `workers` table."""
    from .models import Worker

    return {
        (row["role"], row["status"]): row["n"]
        for row in Worker.objects.using(using)
        .order_by()
        .values("role", "status")
        .annotate(n=Count("*"))
    }


# --- the whole dashboard ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dashboard:
    """Everything the dashboard page shows, computed against one database clock reading."""

    now: datetime
    lease_health: LeaseHealthSummary
    backlog: Backlog
    statuses: StatusCounts
    retries: RetryDistribution
    retries_as_of: datetime | None  # None: computed for this page
    throughput: Throughput
    sweep: SweepHealth
    workers: tuple[ProcessInfo, ...]
    orphan_holders: tuple[HolderLeases, ...]
    recoveries: tuple[CheckpointEntry, ...]
    payloads_included: bool


def build_dashboard(
    *,
    include_payloads: bool = False,
    window_minutes: int = 60,
    recoveries: int = 10,
    using: str = "default",
) -> Dashboard:
    """Compute every figure of the dashboard (ten indexed queries).

    Items by status are assembled from queries the page needs anyway: pending
    from the backlog, in progress from lease health, completed and failed
    from the retry distribution (the only query whose cost grows with the
    table, see RETRY_CACHE_SECONDS); `expired` is one more index range.
    """
    now = database_now(using)
    workers, orphans = live_workers(now=now, using=using)
    health = lease_health(using=using)
    pending = backlog(now=now, using=using)
    retries, retries_as_of = dashboard_retry_distribution(now=now, using=using)
    statuses = StatusCounts(
        pending=pending.pending,
        in_progress=health.active,
        completed=retries.completed,
        failed=retries.failed,
        expired=WorkItem.objects.using(using).filter(status=WorkItemStatus.EXPIRED).count(),
    )
    return Dashboard(
        now=now,
        lease_health=health,
        backlog=pending,
        statuses=statuses,
        retries=retries,
        retries_as_of=retries_as_of,
        throughput=throughput(window_minutes=window_minutes, now=now, using=using),
        sweep=sweep_health(now=now, using=using),
        workers=workers,
        orphan_holders=orphans,
        recoveries=recent_recoveries(
            limit=recoveries, include_payloads=include_payloads, using=using
        ),
        payloads_included=include_payloads,
    )


def _duration(seconds: float) -> str:
    """`95` -> `1 min 35 s`: two units at most, short enough for a table cell."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 10:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def humanize_seconds(seconds: float | None) -> str:
    """A duration for display (`—` for None)."""
    return "—" if seconds is None else _duration(seconds)


__all__ = [
    "THROUGHPUT_WINDOWS",
    "Backlog",
    "CheckpointEntry",
    "Dashboard",
    "HolderLeases",
    "ItemCensus",
    "LeaseHealthSummary",
    "ProcessCounters",
    "ProcessInfo",
    "RetryBucket",
    "RetryDistribution",
    "StatusCounts",
    "SweepHealth",
    "TaskItem",
    "Throughput",
    "ThroughputBucket",
    "Timeline",
    "backlog",
    "build_dashboard",
    "dashboard_retry_distribution",
    "humanize_seconds",
    "item_census",
    "known_queues",
    "known_work_types",
    "lease_health",
    "live_workers",
    "process_counters",
    "processes_by_state",
    "recent_recoveries",
    "retry_distribution",
    "sweep_health",
    "task_timeline",
    "throughput",
]
