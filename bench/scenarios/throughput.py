"""throughput: M no-op items drained by N real `runworker --burst` processes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bench.common import progress
from bench.config import RUNWORKER_OPTIONS
from bench.context import Bench
from bench.drain import drain_runworker
from bench.report import Row, p50_p99


def run(bench: Bench) -> dict[str, Any]:
    runs = []
    for n in bench.sizes.workers:
        progress(f"  runworker x{n}: {bench.sizes.items} items")
        result = drain_runworker(bench, n, bench.sizes.items)
        progress(f"    {result['jobs_per_s']} jobs/s")
        runs.append(result)
    return {
        "items": bench.sizes.items,
        "runworker_options": ["--burst", *RUNWORKER_OPTIONS],
        "runs": runs,
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        n = run["workers"]
        yield Row(
            f"runworker x{n} jobs/s (rows | wall)",
            f"{run['jobs_per_s']} | {run['wall_jobs_per_s']}",
        )
        yield Row(f"  x{n} enqueue->start p50/p99 ms", p50_p99(run["enqueue_to_start_ms"]))
        yield Row(
            f"  x{n} client CPU ms/job, machine busy %",
            f"{run['client_cpu_ms_per_job']}, {run['machine_cpu_busy_pct']}",
        )
