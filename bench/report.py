"""The readable table the benchmark prints after its JSON lines."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Row:
    """One line of the table. `absolute`: a figure in seconds or items/s whose
    target holds only on a fast enough host, so the table prints the same run's
    raw-loop speed beside it."""

    metric: str
    value: Any
    target: str = ""
    met: bool | None = None
    absolute: bool = False

    def cells(self, loop: str) -> tuple[str, str, str, str, str]:
        status = "" if self.met is None else ("met" if self.met else "MISSED")
        return (self.metric, str(self.value), self.target, status, loop if self.absolute else "")


def format_table(rows: Iterable[Row], raw_loop: float | None = None) -> str:
    """The rows as aligned columns; `raw_loop` (jobs/s of the single-item loop at
    4 processes in the same run) goes beside every absolute figure."""
    loop = f"{raw_loop:,.0f}" if raw_loop else "-"
    lines = [row.cells(loop) for row in rows]
    header = ("metric", "value", "target", "status", "raw loop x4 jobs/s")
    widths = [max(len(line[i]) for line in [*lines, header]) for i in range(5)]
    out = []
    for line in [header, tuple("-" * w for w in widths), *lines]:
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip())
    return "\n".join(out)


def p50_p99(summary: dict[str, Any]) -> str:
    """`p50 / p99` of a latency summary, as the table shows it."""
    return f"{summary.get('p50')} / {summary.get('p99')}"


def samples(values: Iterable[float]) -> str:
    """`a / b / c`: the samples of one figure, as the table and progress lines show them."""
    return " / ".join(f"{x:g}" for x in values)


def two_sides(left: Iterable[float], right: Iterable[float]) -> str:
    """`a / b | c / d`: the samples of two figures compared by their medians."""
    return f"{samples(left)} | {samples(right)}"


def median_of(values: list[float] | None) -> str:
    """` (median of a, b, c)` after a figure that is the median of those samples; '' without."""
    return f" (median of {', '.join(f'{x:g}' for x in values)})" if values else ""
