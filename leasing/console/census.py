"""Items by status, the retry distribution and the claims counter.

They come from index-only scans of `work_items_status_retry_idx` (retry_count,
status, lease_token): exact counts, at the cost of reading one narrow index
entry per row, about 80 ms per million rows on a 2-core PostgreSQL server.
That is the one dashboard cost that grows with the table, so the dashboard
reuses an expensive retry distribution for up to a minute and shows its age
(`RETRY_CACHE_SECONDS`); `/metrics` always counts at scrape time.

The statuses counted are the four an item can be in. The `expired` value the
table's CHECK constraint also allows is never stored: the sweep passes an
item through it inside one statement.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db import connections
from django.db.models import Count, Sum

from ..models import WorkItem, WorkItemStatus

# The statuses an item can be in; `expired` is never stored (see above).
STATUSES: tuple[str, ...] = (
    WorkItemStatus.PENDING,
    WorkItemStatus.IN_PROGRESS,
    WorkItemStatus.COMPLETED,
    WorkItemStatus.FAILED,
)
FINISHED: tuple[str, ...] = (WorkItemStatus.COMPLETED, WorkItemStatus.FAILED)


class CompletedAndFailed:
    """A bucket of finished items: `completed` and `failed` counts and their total."""

    __slots__ = ()
    completed: int
    failed: int

    @property
    def total(self) -> int:
        return self.completed + self.failed


class FinishedTotals:
    """Sums over `buckets` that have `completed`, `failed` and `total`."""

    __slots__ = ()
    buckets: tuple[Any, ...]

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
class RetryBucket(CompletedAndFailed):
    """Finished items that needed `retry_count` retries."""

    retry_count: int
    completed: int
    failed: int


@dataclass(frozen=True, slots=True)
class RetryDistribution(FinishedTotals):
    """Completed vs failed items by retry count (the monitoring query, split by status)."""

    buckets: tuple[RetryBucket, ...]

    def counts(self) -> dict[int, int]:
        """`{retry_count: COUNT(*)}`: exactly the rows of the monitoring query."""
        return {b.retry_count: b.total for b in self.buckets}


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Exact number of work items in each status."""

    pending: int = 0
    in_progress: int = 0
    completed: int = 0
    failed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {status: getattr(self, status) for status in STATUSES}

    @property
    def total(self) -> int:
        return sum(self.as_dict().values())


@dataclass(frozen=True, slots=True)
class ItemCensus:
    """Everything one scan of `work_items_status_retry_idx` yields."""

    statuses: StatusCounts
    retries: RetryDistribution
    claims_total: int  # SUM(lease_token): every claim adds one, nothing subtracts


def _distribution(rows: Iterable[Mapping[str, Any]]) -> RetryDistribution:
    """Fold `{status, retry_count, n}` rows of finished items into buckets."""
    finished: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(FINISHED, 0))
    for row in rows:
        if row["status"] in FINISHED:
            finished[row["retry_count"]][row["status"]] += row["n"]
    return RetryDistribution(
        tuple(
            RetryBucket(retry_count=count, completed=v["completed"], failed=v["failed"])
            for count, v in sorted(finished.items())
        )
    )


def item_census(*, using: str = "default") -> ItemCensus:
    """Items by status, the retry distribution and the claims counter, in one query.

    `GROUP BY status, retry_count` with `SUM(lease_token)` reads only the
    columns of `work_items_status_retry_idx`, so PostgreSQL answers it with an
    index-only scan instead of reading the table.
    """
    rows = list(
        WorkItem.objects.using(using)
        .order_by()
        .values("status", "retry_count")
        .annotate(n=Count("*"), tokens=Sum("lease_token"))
    )
    per_status: dict[str, int] = defaultdict(int)
    for row in rows:
        per_status[row["status"]] += row["n"]
    return ItemCensus(
        statuses=StatusCounts(**{s: per_status.get(s, 0) for s in STATUSES}),
        retries=_distribution(rows),
        claims_total=int(sum(row["tokens"] or 0 for row in rows)),
    )


def retry_distribution(*, using: str = "default") -> RetryDistribution:
    """Only the finished rows (the index range for 'completed' and 'failed')."""
    return _distribution(
        WorkItem.objects.using(using)
        .finished()
        .order_by()
        .values("status", "retry_count")
        .annotate(n=Count("*"))
    )


# The retry distribution is the one dashboard figure that reads every finished
# row. Once it costs more than RETRY_CACHE_MIN_MS, the dashboard reuses it for
# up to RETRY_CACHE_SECONDS (so any number of viewers scan at most once a
# minute) and says how old it is. Everything else on the page is read live.
# Set RETRY_CACHE_SECONDS = 0 to always recompute.
RETRY_CACHE_SECONDS = 60.0
RETRY_CACHE_MIN_MS = 50.0


@dataclass(frozen=True, slots=True)
class _CachedRetries:
    distribution: RetryDistribution
    computed_at: datetime


def _retry_cache_key(using: str) -> str:
    name = connections[using].settings_dict.get("NAME")
    return f"leasing:dashboard:retries:{using}:{name}"


def cached_retry_distribution(
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
