"""options: runworker --concurrency and LEASING["PREFETCH"] combinations at 4 processes,
interleaved."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

from bench.common import progress
from bench.config import OPTION_GRID, OPTION_ITEMS_CAP
from bench.context import Bench
from bench.drain import drain_runworker
from bench.report import Row


def run(bench: Bench) -> dict[str, Any]:
    """Each option set drains the same items `options_repeats` times, interleaved.

    On a shared machine a single short drain swings by tens of percent with
    whatever else runs; the best of the repeats is the closest to what the
    configuration can do, the median is reported beside it.
    """
    n, m = bench.sizes.options_workers, bench.sizes.options_items
    grid = OPTION_GRID if not bench.args.quick else OPTION_GRID[:2]
    samples: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in grid}
    counts = {label: min(m, OPTION_ITEMS_CAP.get(label, m)) for label, _, _ in grid}
    for repeat in range(bench.sizes.options_repeats):
        for label, options, prefetch in grid:
            count = counts[label]
            progress(f"  runworker x{n} {label} (run {repeat + 1}): {count} items")
            leasing = {} if prefetch is None else {"PREFETCH": prefetch}
            result = drain_runworker(bench, n, count, options, leasing=leasing)
            progress(f"    {result['jobs_per_s']} jobs/s")
            samples[label].append(result)
    runs = []
    for label, options, prefetch in grid:
        got = samples[label]
        rates = [r["jobs_per_s"] or 0.0 for r in got]
        runs.append(
            {
                "config": label,
                "options": list(options),
                "prefetch": prefetch,
                "jobs_per_s": max(rates),
                "jobs_per_s_median": round(statistics.median(rates), 1),
                "jobs_per_s_each": rates,
                "completed": min(r["completed"] for r in got),
                "items": counts[label],
                "claimed_more_than_once": max(r["claimed_more_than_once"] for r in got),
                "wall_jobs_per_s": max(r["wall_jobs_per_s"] for r in got),
                "client_cpu_us_per_job": min(r["client_cpu_us_per_job"] for r in got),
                "xact_per_job": min(r["xact_per_job"] for r in got),
                "start_to_complete_ms": got[0]["start_to_complete_ms"],
            }
        )
    best = max(runs, key=lambda r: r["jobs_per_s"])
    return {
        "items": m,
        "workers": n,
        "repeats": bench.sizes.options_repeats,
        "runs": runs,
        "best": best["config"],
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        each = " / ".join(f"{x:g}" for x in run["jobs_per_s_each"])
        yield Row(f"options x{r['workers']} {run['config']}", f"{each} jobs/s")
