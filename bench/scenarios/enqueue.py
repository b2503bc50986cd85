"""enqueue: `enqueue_many()` of 100,000 items into an empty table, in-process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from bench.common import BenchError
from bench.config import TARGETS
from bench.context import Bench
from bench.report import Row


def run(bench: Bench) -> dict[str, Any]:
    from leasing import enqueue_many

    n = bench.sizes.enqueue_items
    bench.reset()
    bench.vacuum_analyze()
    specs = [
        {"task_id": f"task-{i}", "work_type": "bench.noop", "input_data": {"i": i}}
        for i in range(n)
    ]
    start = time.perf_counter()
    items = enqueue_many(specs)
    seconds = time.perf_counter() - start
    stored = bench.one("SELECT count(*) FROM work_items")
    if len(items) != n or stored != n:
        raise BenchError(f"enqueue_many returned {len(items)} items, {stored} stored, not {n}")
    result: dict[str, Any] = {
        "items": n,
        "seconds": round(seconds, 3),
        "items_per_s": round(n / seconds),
    }
    if n >= 100_000:
        result["target_s"] = TARGETS["enqueue_100k_s"]
        result["met"] = seconds < TARGETS["enqueue_100k_s"]
    return result


def rows(r: dict[str, Any]) -> Iterator[Row]:
    yield Row(
        f"enqueue_many {r['items']:,} items",
        f"{r['seconds']:.2f} s ({r['items_per_s']:,}/s)",
        "< 5 s" if "met" in r else "",
        r.get("met"),
        absolute=True,
    )
