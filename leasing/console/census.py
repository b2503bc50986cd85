"""Items by status, the retry distribution and the claims counter.

Two ways of counting, for two readers:

* `item_census` (for `/metrics`) and `retry_distribution()` without a start
  count every row exactly, through index-only scans of
  `work_items_status_retry_idx` (retry_count, status, lease_token; every row
  but the in-flight ones, counted apart), whose cost grows with the table.
* The dashboard must stay fast at any size, so it reads only what is bounded:
  the retry distribution of the items finished in its window (from the
  window's groups, `console.finished`), and the number of completed and
  failed items exactly while small, else the planner's estimate, marked as
  such (`status_count`). `retry_distribution(since=...)` counts a window's
  rows directly (index-only on `work_items_finished_idx`).

The statuses counted are the four an item can be in. The `expired` value the
table's CHECK constraint also allows is never stored: the sweep passes an
item through it inside one statement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum

from ..models import WorkItem, WorkItemStatus
from ..sql.runner import run
from ..storage import storage_for

# The statuses an item can be in; `expired` is never stored (see above).
STATUSES: tuple[str, ...] = (
    WorkItemStatus.PENDING,
    WorkItemStatus.IN_PROGRESS,
    WorkItemStatus.COMPLETED,
    WorkItemStatus.FAILED,
    WorkItemStatus.CANCELLED,
)
# The outcomes the retry distribution counts (a cancellation is not one).
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
    """Number of work items in each status; those in `estimated` are the planner's estimate."""

    pending: int = 0
    in_progress: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    estimated: frozenset[str] = frozenset()

    def as_dict(self) -> dict[str, int]:
        return {status: getattr(self, status) for status in STATUSES}

    def rows(self) -> tuple[tuple[str, int, bool], ...]:
        """`(status, count, estimated)` per status, for the page."""
        return tuple((s, getattr(self, s), s in self.estimated) for s in STATUSES)

    @property
    def total(self) -> int:
        return sum(self.as_dict().values())


@dataclass(frozen=True, slots=True)
class ItemCensus:
    """Everything the census's two index-only reads yield (`item_census`)."""

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
    """Items by status, the retry distribution and the claims counter, in two reads.

    `GROUP BY status, retry_count` with `SUM(lease_token)` reads only the
    columns of `work_items_status_retry_idx`, so PostgreSQL answers it with an
    index-only scan instead of reading the table. That index leaves out the
    in-flight rows (a claim does not write it), which are read apart, from
    `work_items_in_flight_idx`: there are only as many as the workers run.
    """
    items = WorkItem.objects.using(using).order_by()
    in_flight = Q(status=WorkItemStatus.IN_PROGRESS)
    rows = [
        row
        for part in (items.exclude(in_flight), items.filter(in_flight))
        for row in part.values("status", "retry_count").annotate(
            n=Count("*"), tokens=Sum("lease_token")
        )
    ]
    per_status: dict[str, int] = defaultdict(int)
    for row in rows:
        per_status[row["status"]] += row["n"]
    return ItemCensus(
        statuses=StatusCounts(
            pending=per_status.get(WorkItemStatus.PENDING, 0),
            in_progress=per_status.get(WorkItemStatus.IN_PROGRESS, 0),
            completed=per_status.get(WorkItemStatus.COMPLETED, 0),
            failed=per_status.get(WorkItemStatus.FAILED, 0),
            cancelled=per_status.get(WorkItemStatus.CANCELLED, 0),
        ),
        retries=_distribution(rows),
        claims_total=int(sum(row["tokens"] or 0 for row in rows)),
    )


def retry_distribution(
    *, since: datetime | None = None, using: str = "default"
) -> RetryDistribution:
    """Finished items by status and retry count; with `since`, only those finished since then.

    Without `since` it reads every finished row (the monitoring query);
    with it, the range of `work_items_finished_idx` from `since` on.
    """
    finished = WorkItem.objects.using(using).finished().order_by()
    if since is not None:
        finished = finished.filter(completed_at__gte=since)
    return _distribution(finished.values("status", "retry_count").annotate(n=Count("*")))


# Counted exactly up to this many rows; past it, the planner's estimate.
EXACT_COUNT_LIMIT = 10_000


def status_count(status: str, *, using: str = "default") -> tuple[int, bool]:
    """`(count, estimated)` of the items in `status` (`status_counts`)."""
    return status_counts((status,), using=using)[status]


def status_counts(
    statuses: Sequence[str], *, using: str = "default"
) -> dict[str, tuple[int, bool]]:
    """`{status: (count, estimated)}` of the items in each status.

    On PostgreSQL the planner's estimates come first (an EXPLAIN each, well
    under a millisecond, sent in one round trip); only a status it puts near
    or below `EXACT_COUNT_LIMIT` is counted exactly, which then reads at most
    that many index entries (those counts in one more round trip). Counting a
    million finished rows on every page view would cost a scan. SQLite counts
    exactly, in one grouped read.
    """
    items = WorkItem.objects.using(using).order_by()
    storage = storage_for(using)
    if not storage.estimates_rows:
        grouped = items.filter(status__in=statuses).values_list("status").annotate(n=Count("*"))
        counted: dict[str, int] = dict(grouped)
        return {status: (counted.get(status, 0), False) for status in statuses}
    # The rows' number, not their columns: explained as a one-column query.
    estimates = dict(
        zip(
            statuses,
            storage.estimated_rows_many([items.filter(status=s).values("pk") for s in statuses]),
            strict=True,
        )
    )
    near = [s for s in statuses if estimates[s] <= 2 * EXACT_COUNT_LIMIT]
    capped = capped_counts(
        {s: items.filter(status=s).values("pk")[: EXACT_COUNT_LIMIT + 1] for s in near}, using
    )
    counts = {s: (estimates[s], True) for s in statuses if s not in capped}
    for status, n in capped.items():
        if n <= EXACT_COUNT_LIMIT:
            counts[status] = (n, False)
        else:
            counts[status] = (max(EXACT_COUNT_LIMIT + 1, estimates[status]), True)
    return counts


def capped_counts(capped: Mapping[str, QuerySet[Any, Any]], using: str) -> dict[str, int]:
    """`{name: rows}` of querysets (LIMITed, so each reads at most so many entries),
    counted in one statement."""
    if not capped:
        return {}
    branches, params = [], []
    for name, queryset in capped.items():
        sql, query_params = queryset.query.get_compiler(using=using).as_sql()
        branches.append(f"SELECT %s AS name, (SELECT COUNT(*) FROM ({sql}) AS capped) AS n")
        params += [name, *query_params]
    rows = run(using, (" UNION ALL ".join(branches), params))
    return {str(row["name"]): int(row["n"]) for row in rows}
