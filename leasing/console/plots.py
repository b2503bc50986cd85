"""Geometry of the history page's inline SVG: run-time lines, worker bars, peak-hour heat map."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from .charts import nice_ceiling
from .history import DurationSeries, WorkerShare

SERIES_COLOURS = 8  # CSS classes leasing-series-0 .. -7
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


@dataclass(frozen=True, slots=True)
class Line:
    work_type: str
    quantile: str  # "p50" or "p95"
    colour: int
    points: str  # the polyline's "x,y x,y ..."
    dots: tuple[tuple[float, float, str], ...]  # x, y, tooltip


@dataclass(frozen=True, slots=True)
class LineChart:
    width: int
    height: int
    plot_left: int
    plot_width: int
    baseline: float
    lines: tuple[Line, ...]
    gridlines: tuple[tuple[float, str], ...]
    labels: tuple[tuple[float, str], ...]  # x, text under the axis
    label_y: float


def duration_chart(
    series: tuple[DurationSeries, ...], *, start: datetime, step: timedelta, count: int
) -> LineChart:
    """p50 (solid) and p95 (dashed) run time of each work type, one point per bucket."""
    left, top, plot_width, plot_height, bottom = 60, 10, 620, 180, 24
    baseline = top + plot_height
    largest = max((p.p95 for s in series for p in s.points), default=0.0)
    axis_max = _axis_seconds(largest)
    slot = plot_width / max(count, 1)

    def x(moment: datetime) -> float:
        return round(left + ((moment - start) / step + 0.5) * slot, 1)

    def y(seconds: float) -> float:
        return round(baseline - plot_height * min(seconds, axis_max) / axis_max, 1)

    lines = []
    for index, s in enumerate(series):
        for quantile in ("p50", "p95"):
            coords = [(x(p.start), y(getattr(p, quantile)), p) for p in s.points]
            lines.append(
                Line(
                    work_type=s.work_type,
                    quantile=quantile,
                    colour=index % SERIES_COLOURS,
                    points=" ".join(f"{cx},{cy}" for cx, cy, _ in coords),
                    dots=tuple(
                        (cx, cy, _tip(s.work_type, quantile, getattr(p, quantile), p.count))
                        for cx, cy, p in coords
                    ),
                )
            )
    every = max(1, count // 6)
    labels = tuple(
        (round(left + (i + 0.5) * slot, 1), _label(start + i * step, step))
        for i in range(0, count, every)
    )
    gridlines = tuple(
        (round(baseline - plot_height * f, 1), f"{axis_max * f:g} s") for f in (0, 0.5, 1)
    )
    return LineChart(
        width=left + plot_width + 10,
        height=top + plot_height + bottom,
        plot_left=left,
        plot_width=plot_width,
        baseline=baseline,
        lines=tuple(lines),
        gridlines=gridlines,
        labels=labels,
        label_y=baseline + 16,
    )


def _axis_seconds(largest: float) -> float:
    """1, 2 or 5 times a power of ten, at least `largest` (fractions of a second too)."""
    if largest >= 1:
        return float(nice_ceiling(largest))
    if largest <= 0:
        return 1.0
    exponent = 10.0 ** math.floor(math.log10(largest))
    return next(round(m * exponent, 6) for m in (1, 2, 5, 10) if m * exponent >= largest)


def _tip(work_type: str, quantile: str, seconds: float, count: int) -> str:
    return f"{work_type} {quantile} {seconds:.2f} s ({count} items)"


def _label(moment: datetime, step: timedelta) -> str:
    local = timezone.localtime(moment)
    return local.strftime("%a %H:%M" if step >= timedelta(hours=6) else "%H:%M")


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    completed: int
    failed: int
    y: int
    completed_width: float
    failed_x: float
    failed_width: float
    text_x: float


@dataclass(frozen=True, slots=True)
class BarChart:
    width: int
    height: int
    label_width: int
    bar_height: int
    bars: tuple[Bar, ...]


def worker_bars(shares: tuple[WorkerShare, ...]) -> BarChart:
    """Completed then failed items of each worker process, one row each."""
    label_width, plot_width, row, bar_height = 260, 360, 24, 16
    largest = max((s.total for s in shares), default=0) or 1
    bars = []
    for index, share in enumerate(shares):
        completed = plot_width * share.completed / largest
        failed = plot_width * share.failed / largest
        bars.append(
            Bar(
                label=share.worker_id,
                completed=share.completed,
                failed=share.failed,
                y=index * row + 4,
                completed_width=round(completed, 1),
                failed_x=round(label_width + completed, 1),
                failed_width=round(failed, 1),
                text_x=round(label_width + completed + failed + 6, 1),
            )
        )
    return BarChart(
        width=label_width + plot_width + 160,
        height=max(1, len(bars)) * row + 8,
        label_width=label_width,
        bar_height=bar_height,
        bars=tuple(bars),
    )


@dataclass(frozen=True, slots=True)
class Cell:
    x: int
    y: int
    count: int
    opacity: float
    title: str


@dataclass(frozen=True, slots=True)
class HeatMap:
    width: int
    height: int
    size: int
    left: int
    top: int
    cells: tuple[Cell, ...]
    rows: tuple[tuple[int, str], ...]  # y, weekday
    columns: tuple[tuple[int, str], ...]  # x, hour
    largest: int


def heat_map(peak: tuple[tuple[int, ...], ...]) -> HeatMap:
    """Completions by weekday (rows) and hour of day (columns); darker is busier."""
    size, left, top = 22, 40, 18
    largest = max((n for day in peak for n in day), default=0)
    cells = []
    for d, day in enumerate(peak):
        for h, n in enumerate(day):
            opacity = 0.0 if n == 0 else round(0.12 + 0.88 * n / largest, 3)
            title = f"{WEEKDAYS[d]} {h:02d}:00-{h:02d}:59: {n} completed"
            cells.append(Cell(left + h * size, top + d * size, n, opacity, title))
    return HeatMap(
        width=left + 24 * size + 4,
        height=top + 7 * size + 4,
        size=size - 2,
        left=left,
        top=top,
        cells=tuple(cells),
        rows=tuple((top + d * size + size // 2 + 4, WEEKDAYS[d]) for d in range(7)),
        columns=tuple((left + h * size + 2, f"{h:02d}") for h in range(0, 24, 3)),
        largest=largest,
    )
