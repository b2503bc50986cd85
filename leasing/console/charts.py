"""Geometry of the dashboard's inline SVG charts.

Charts are drawn on the server: no CDN, no script, and they work offline. The
functions here only turn figures into coordinates; the templates draw them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from .backlog import Throughput
from .census import RetryDistribution


def nice_ceiling(value: float) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is >= value (axis maximum)."""
    if value <= 1:
        return 1
    exponent = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * exponent >= value:
            return int(step * exponent)
    return int(10 * exponent)  # pragma: no cover


# --- retry distribution: horizontal stacked bars --------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryBar:
    label: str
    retry_count: int
    completed: int
    failed: int
    y: float
    completed_width: float
    failed_x: float
    failed_width: float
    text_x: float
    share: float  # percent of all finished items

    @property
    def caption(self) -> str:
        return f"{self.completed:,} completed · {self.failed:,} failed ({self.share:g} %)"


@dataclass(frozen=True, slots=True)
class RetryChart:
    width: int
    height: int
    bars: tuple[RetryBar, ...]
    label_width: int
    bar_height: int
    total: int


def retry_chart(distribution: RetryDistribution) -> RetryChart:
    """Completed then failed, one row per retry count."""
    label_width, plot_width, row, bar_height = 96, 400, 30, 20
    largest = max(distribution.largest, 1)
    total = max(distribution.completed + distribution.failed, 1)

    def scaled(n: int) -> float:
        return 0.0 if n == 0 else max(2.0, plot_width * n / largest)

    bars = []
    for index, bucket in enumerate(distribution.buckets):
        completed_width = scaled(bucket.completed)
        failed_width = scaled(bucket.failed)
        bars.append(
            RetryBar(
                label=f"{bucket.retry_count} {'retry' if bucket.retry_count == 1 else 'retries'}",
                retry_count=bucket.retry_count,
                completed=bucket.completed,
                failed=bucket.failed,
                y=index * row + 4,
                completed_width=round(completed_width, 1),
                failed_x=round(label_width + completed_width, 1),
                failed_width=round(failed_width, 1),
                text_x=round(label_width + completed_width + failed_width + 6, 1),
                share=round(100 * bucket.total / total, 1),
            )
        )
    return RetryChart(
        width=label_width + plot_width + 290,
        height=max(1, len(bars)) * row + 8,
        bars=tuple(bars),
        label_width=label_width,
        bar_height=bar_height,
        total=distribution.completed + distribution.failed,
    )


# --- throughput: vertical stacked columns ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThroughputColumn:
    start: datetime
    label: str
    show_label: bool
    completed: int
    failed: int
    x: float
    width: float
    completed_y: float
    completed_height: float
    failed_y: float
    failed_height: float


@dataclass(frozen=True, slots=True)
class ThroughputChart:
    width: int
    height: int
    plot_left: int
    plot_width: int
    plot_height: int
    baseline: int
    axis_max: int
    gridlines: tuple[tuple[float, int], ...]
    columns: tuple[ThroughputColumn, ...]
    label_y: int


def throughput_chart(data: Throughput) -> ThroughputChart:
    """One column per bucket: completed below, failed on top."""
    left, top, plot_width, plot_height, bottom = 52, 10, 560, 150, 24
    axis_max = nice_ceiling(data.largest)
    count = max(len(data.buckets), 1)
    slot = plot_width / count
    label_every = max(1, math.ceil(count / 6))
    baseline = top + plot_height
    columns = []
    for index, bucket in enumerate(data.buckets):
        completed_h = plot_height * bucket.completed / axis_max
        failed_h = plot_height * bucket.failed / axis_max
        columns.append(
            ThroughputColumn(
                start=bucket.start,
                label=timezone.localtime(bucket.start).strftime("%H:%M"),
                show_label=index % label_every == 0,
                completed=bucket.completed,
                failed=bucket.failed,
                x=round(left + index * slot + slot * 0.1, 1),
                width=round(slot * 0.8, 1),
                completed_y=round(baseline - completed_h, 1),
                completed_height=round(completed_h, 1),
                failed_y=round(baseline - completed_h - failed_h, 1),
                failed_height=round(failed_h, 1),
            )
        )
    # A middle line only where its value is a whole number: on a 1 or 5 axis it
    # was labelled "0" or "2" at 0.5 and 2.5.
    gridlines = tuple(
        (round(baseline - plot_height * fraction, 1), int(axis_max * fraction))
        for fraction in (0, 0.5, 1)
        if (axis_max * fraction).is_integer()
    )
    return ThroughputChart(
        width=left + plot_width + 10,
        height=top + plot_height + bottom,
        plot_left=left,
        plot_width=plot_width,
        plot_height=plot_height,
        baseline=baseline,
        axis_max=axis_max,
        gridlines=gridlines,
        columns=tuple(columns),
        label_y=baseline + 16,
    )
