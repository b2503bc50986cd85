"""The items finished in a window, grouped once for every figure of the window.

Every finished figure of the dashboard, the history page and the queue
table (throughput, retry counts, per-pair counts, run-time percentiles,
averages, peak hours) is folded here, in Python, from one `FinishedWindow`:
groups of the items finished per (bucket, queue, work type, status), each
with its retry counts, a run-time histogram and counts per quarter hour
(`leasing.services.rollups.FinishedGroup`). One grouped read replaces a
query per figure.

* A window shorter than `ROLLED_WINDOW_MINUTES` is read from `work_items`
  (`work_items_finished_idx`, index-only), in buckets of its throughput
  chart's length.
* A day or a week starts on an hour (the first whole hour inside it) and is
  read as the `leasing_finished_hours` rows the sweep wrote for it, plus the
  items finished since the rollup's mark (at most a quarter hour and the
  sweep's grace back): a few hundred small rows and minutes of items, where
  reading the window's items meant 150,000 index entries a week at 15 items
  a minute.

Counts and retry counts are exact. Run-time percentiles come from the merged
histograms, interpolated between ranks as PostgreSQL's `percentile_cont`
does: within 6% of the exact figure (`leasing.sql.rollups`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from ..services.rollups import (
    FinishedGroup,
    ceil_hour,
    finished_groups,
    rolled_groups,
    rollup_mark,
)
from ..sql.rollups import bucket_value
from ..states import WorkItemStatus
from .census import FINISHED, RetryBucket, RetryDistribution
from .windows import bucket_bounds

ROLLED_WINDOW_MINUTES = 1440


def is_rolled(window_minutes: int) -> bool:
    return window_minutes >= ROLLED_WINDOW_MINUTES


@dataclass(frozen=True, slots=True)
class FinishedWindow:
    """Groups of the items finished from `start` to now."""

    start: datetime
    groups: tuple[FinishedGroup, ...]
    rolled_through: datetime | None = None  # what finished before it was read from the rollup

    def since(self, moment: datetime) -> FinishedWindow:
        """The part of an hourly window from the first whole hour after `moment`."""
        start = max(self.start, ceil_hour(moment))
        return replace(self, start=start, groups=tuple(g for g in self.groups if g.start >= start))

    def only(self, *, queue: str | None = None, work_type: str | None = None) -> FinishedWindow:
        """The part of the window of one queue and/or one work type (None: every one)."""
        if queue is None and work_type is None:
            return self
        groups = tuple(
            g
            for g in self.groups
            if (queue is None or g.queue_name == queue)
            and (work_type is None or g.work_type == work_type)
        )
        return replace(self, groups=groups)

    def retries(self) -> RetryDistribution:
        counts: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(FINISHED, 0))
        for group in self.groups:
            if group.status not in FINISHED:  # a cancellation is no retry outcome
                continue
            for retry_count, n in group.retries.items():
                counts[retry_count][group.status] += n
        return RetryDistribution(
            tuple(
                RetryBucket(
                    retry_count=r,
                    completed=c[WorkItemStatus.COMPLETED],
                    failed=c[WorkItemStatus.FAILED],
                )
                for r, c in sorted(counts.items())
            )
        )

    def count(self, status: str) -> int:
        return sum(g.items for g in self.groups if g.status == status)

    def average_run_seconds(self) -> float | None:
        timed = sum(g.timed for g in self.groups)
        return None if timed == 0 else sum(g.run_seconds for g in self.groups) / timed


def finished_for(
    *,
    window_minutes: int,
    now: datetime,
    using: str = "default",
    week: FinishedWindow | None = None,
) -> FinishedWindow:
    """The last `window_minutes`: from the rollup for a day or more, else from the items.

    `week`: the last week's window when the caller has read it; a day or a
    week is then cut from it instead of read again.
    """
    if is_rolled(window_minutes):
        if week is not None:
            return week.since(now - timedelta(minutes=window_minutes))
        return finished_window(now - timedelta(minutes=window_minutes), using=using)
    first_bucket, step, _ = bucket_bounds(window_minutes, now)
    start = now - timedelta(minutes=window_minutes)
    groups = finished_groups(start, step=step, origin=first_bucket, using=using)
    return FinishedWindow(start=start, groups=tuple(groups))


def finished_window(start: datetime, *, using: str = "default") -> FinishedWindow:
    """The items finished since the first whole hour at or after `start`, per hour."""
    start = ceil_hour(start)
    mark = rollup_mark(using=using)
    split = start if mark is None else max(start, mark)
    rolled = rolled_groups(start, split, using=using) if split > start else []
    recent = finished_groups(split, using=using)
    return FinishedWindow(start=start, groups=(*rolled, *recent), rolled_through=mark)


def merge(histograms: Iterable[Mapping[int, int]]) -> dict[int, int]:
    merged: dict[int, int] = defaultdict(int)
    for histogram in histograms:
        for bucket, n in histogram.items():
            merged[bucket] += n
    return merged


def histogram_percentile(histogram: Mapping[int, int], fraction: float) -> float | None:
    """The run time at `fraction`, as `percentile_cont` over the buckets' midpoints.

    The ranks either side of `fraction * (n - 1)` are read as their buckets'
    midpoints and interpolated linearly.
    """
    total = sum(histogram.values())
    if total == 0:
        return None
    rank = fraction * (total - 1)
    low = math.floor(rank)
    values = _values_at(histogram, (low, min(low + 1, total - 1)))
    return values[0] + (values[1] - values[0]) * (rank - low)


def _values_at(histogram: Mapping[int, int], ranks: tuple[int, int]) -> list[float]:
    """The bucket midpoints of the items at these 0-based ranks (ascending ranks)."""
    values: list[float] = []
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        while len(values) < len(ranks) and seen > ranks[len(values)]:
            values.append(bucket_value(bucket))
    return values


def per_bucket(
    groups: Iterable[FinishedGroup], start: datetime, step: timedelta, count: int
) -> dict[int, list[FinishedGroup]]:
    """Groups by the index of the bucket (of `step`, from `start`) holding their start."""
    buckets: dict[int, list[FinishedGroup]] = defaultdict(list)
    for group in groups:
        index = int((group.start - start) // step)
        if 0 <= index < count:
            buckets[index].append(group)
    return buckets
