"""The readable table the benchmark prints after its JSON lines."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Row:
    metric: str
    value: Any
    target: str = ""
    met: bool | None = None

    def cells(self) -> tuple[str, str, str, str]:
        status = "" if self.met is None else ("met" if self.met else "MISSED")
        return (self.metric, str(self.value), self.target, status)


def format_table(rows: Iterable[Row]) -> str:
    lines = [row.cells() for row in rows]
    header = ("metric", "value", "target", "status")
    widths = [max(len(line[i]) for line in [*lines, header]) for i in range(4)]
    out = []
    for line in [header, tuple("-" * w for w in widths), *lines]:
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip())
    return "\n".join(out)


def p50_p99(summary: dict[str, Any]) -> str:
    """`p50 / p99` of a latency summary, as the table shows it."""
    return f"{summary.get('p50')} / {summary.get('p99')}"
