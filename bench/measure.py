"""Small measuring helpers of the benchmark scenarios: rounding, CPU time, query plans."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any


def rnd(value: Any, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)


def sec_summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": round(min(values), 3),
        "p50": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def walk_plan(node: dict[str, Any], out: list[dict[str, Any]]) -> None:
    """The scan nodes of an EXPLAIN (FORMAT JSON) plan, depth first, into `out`."""
    if "Scan" in node.get("Node Type", ""):
        out.append(
            {
                "node": node["Node Type"],
                "index": node.get("Index Name"),
                "rows": node.get("Actual Rows"),
                "heap_fetches": node.get("Heap Fetches"),
                "removed_by_filter": node.get("Rows Removed by Filter"),
                "buffers": node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0),
            }
        )
    for child in node.get("Plans", []):
        walk_plan(child, out)


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process, in seconds (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def busy_pct(a: tuple[int, int], b: tuple[int, int]) -> float | None:
    total = b[1] - a[1]
    return round(100 * (b[0] - a[0]) / total, 1) if total > 0 else None
