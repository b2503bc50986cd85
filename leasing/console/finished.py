"""Items finished in the day and week windows: the hourly rollup plus the hours since.

A window of `ROLLED_WINDOW_MINUTES` or more starts on an hour (the first
whole hour inside it) and is read as the `leasing_finished_hours` rows the
sweep wrote for it, plus the items finished since the rollup's mark, grouped
the same way (`leasing.services.rollups.finished_groups`): a few hundred
small rows and about an hour of items, where reading the window's items
meant 150,000 index entries a week at 15 items a minute, per figure.

Every figure of such a window is folded here from those groups, in Python:
counts and retry counts exactly, run-time percentiles from the merged
histograms (within 6%, see `leasing.sql.rollups`). Shorter windows keep
reading `work_items` and compute exact percentiles.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from ..models import FinishedHour
from ..services.rollups import FinishedGroup, ceil_hour, finished_groups, rollup_mark
from ..sql.rollups import bucket_value
from .census import RetryBucket, RetryDistribution

ROLLED_WINDOW_MINUTES = 1440
COMPLETED = "completed"
FAILED = "failed"


def is_rolled(window_minutes: int) -> bool:
    return window_minutes >= ROLLED_WINDOW_MINUTES


@dataclass(frozen=True, slots=True)
class FinishedWindow:
    """Groups of the items finished from `start` (an hour) to now."""

    start: datetime
    groups: tuple[FinishedGroup, ...]
    rolled_through: datetime | None  # hours before it were read from the rollup

    def since(self, moment: datetime) -> FinishedWindow:
        """The part of this window from the first whole hour after `moment`."""
        start = max(self.start, ceil_hour(moment))
        return replace(self, start=start, groups=tuple(g for g in self.groups if g.hour >= start))

    def retries(self) -> RetryDistribution:
        counts: dict[int, dict[str, int]] = defaultdict(lambda: {COMPLETED: 0, FAILED: 0})
        for group in self.groups:
            for retry_count, n in group.retries.items():
                counts[retry_count][group.status] += n
        return RetryDistribution(
            tuple(
                RetryBucket(retry_count=r, completed=c[COMPLETED], failed=c[FAILED])
                for r, c in sorted(counts.items())
            )
        )

    def count(self, status: str) -> int:
        return sum(g.items for g in self.groups if g.status == status)

    def average_run_seconds(self) -> float | None:
        timed = sum(g.timed for g in self.groups)
        return None if timed == 0 else sum(g.run_seconds for g in self.groups) / timed


# FinishedGroup's fields, in order (values_list: no model instance per row).
_ROLLED_COLUMNS = (
    "hour",
    "queue_name",
    "work_type",
    "status",
    "items",
    "timed",
    "run_seconds",
    "retries",
    "run_histogram",
    "quarters",
)


def finished_window(start: datetime, *, using: str = "default") -> FinishedWindow:
    """The items finished since the first whole hour at or after `start`."""
    start = ceil_hour(start)
    mark = rollup_mark(using=using)
    split = start if mark is None else max(start, mark)
    rows = (
        FinishedHour.objects.using(using)
        .filter(hour__gte=start, hour__lt=split)
        .values_list(*_ROLLED_COLUMNS)
    )
    rolled = [
        FinishedGroup(
            *row[:7],
            retries={int(k): v for k, v in row[7].items()},
            run_histogram={int(k): v for k, v in row[8].items()},
            quarters=tuple(row[9]),
        )
        for row in rows
    ]
    recent = finished_groups(split, using=using)
    return FinishedWindow(start=start, groups=(*rolled, *recent), rolled_through=mark)


def merge(histograms: Iterable[Mapping[int, int]]) -> dict[int, int]:
    merged: dict[int, int] = defaultdict(int)
    for histogram in histograms:
        for bucket, n in histogram.items():
            merged[bucket] += n
    return merged


def histogram_percentile(histogram: Mapping[int, int], fraction: float) -> float | None:
    """The run time at `fraction` (ranks as percentile_cont), a bucket's midpoint."""
    total = sum(histogram.values())
    if total == 0:
        return None
    rank = fraction * (total - 1)
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen > rank:
            return bucket_value(bucket)
    return bucket_value(max(histogram))


def per_bucket(
    groups: Iterable[FinishedGroup], start: datetime, step: timedelta, count: int
) -> dict[int, list[FinishedGroup]]:
    """Groups by the index of the bucket (of `step`, from `start`) holding their hour."""
    buckets: dict[int, list[FinishedGroup]] = defaultdict(list)
    for group in groups:
        index = int((group.hour - start) // step)
        if 0 <= index < count:
            buckets[index].append(group)
    return buckets
