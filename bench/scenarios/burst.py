"""burst: a burst drained right after its enqueue, against the same burst after VACUUM ANALYZE.

One `runworker --concurrency 4` drains B items (default 50,000) enqueued with
`enqueue_many()` into an emptied table, once starting right after the enqueue
(what a user's burst meets: stale statistics, no hint bits, no visibility map;
autovacuum cannot have run yet) and once after `VACUUM ANALYZE`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bench.common import progress
from bench.config import TARGETS
from bench.context import Bench
from bench.drain import drain_runworker
from bench.report import Row
from bench.scenarios.throughput import drain_rows


def run(bench: Bench) -> dict[str, Any]:
    m, c = bench.sizes.burst_items, bench.sizes.burst_concurrency
    runs = []
    for vacuum in (False, True):
        progress(f"  runworker --concurrency {c}: {m} items, vacuumed first: {vacuum}")
        result = drain_runworker(bench, 1, m, ("--concurrency", str(c)), vacuum=vacuum)
        progress(f"    {result['jobs_per_s']} jobs/s")
        runs.append(result)
    cold, warm = runs
    ratio = round(cold["jobs_per_s"] / warm["jobs_per_s"], 3) if warm["jobs_per_s"] else None
    return {
        "items": m,
        "concurrency": c,
        "runs": runs,
        "ratio_unvacuumed_to_vacuumed": ratio,
        "met": ratio is not None and ratio >= TARGETS["burst_unvacuumed_ratio"],
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        when = "after VACUUM ANALYZE" if run["vacuumed"] else "right after enqueue"
        yield from drain_rows(f"burst {r['items']:,}, c{r['concurrency']}, {when},", run)
    yield Row(
        "burst right after enqueue / after VACUUM ANALYZE",
        r["ratio_unvacuumed_to_vacuumed"],
        f">= {TARGETS['burst_unvacuumed_ratio']}",
        r["met"],
    )
