"""burst: a burst drained right after its enqueue, against the same burst after VACUUM ANALYZE.

One `runworker --concurrency 4` drains B items (default 30,000) enqueued with
`enqueue_many()` into an emptied table, once starting right after the enqueue
(what a user's burst meets: stale statistics, no hint bits, no visibility map;
autovacuum cannot have run yet) and once after `VACUUM ANALYZE`. The pair
runs `burst_repeats` times, alternated, and the ratio is of the two medians:
one pair of drains swung between 0.69 and 0.91 on this host with nothing changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from statistics import median
from typing import Any

from bench.common import progress
from bench.config import TARGETS
from bench.context import Bench
from bench.drain import drain_runworker
from bench.report import Row, two_sides
from bench.scenarios.throughput import drain_rows


def run(bench: Bench) -> dict[str, Any]:
    m, c = bench.sizes.burst_items, bench.sizes.burst_concurrency
    runs = []
    for _ in range(bench.sizes.burst_repeats):
        for vacuum in (False, True):
            progress(f"  runworker --concurrency {c}: {m} items, vacuumed first: {vacuum}")
            result = drain_runworker(bench, 1, m, ("--concurrency", str(c)), vacuum=vacuum)
            progress(f"    {result['jobs_per_s']} jobs/s")
            runs.append(result)
    cold = [r["jobs_per_s"] for r in runs if not r["vacuumed"]]
    warm = [r["jobs_per_s"] for r in runs if r["vacuumed"]]
    ratio = round(median(cold) / median(warm), 3) if all(warm) else None
    return {
        "items": m,
        "concurrency": c,
        "runs": runs,
        "unvacuumed_jobs_per_s_runs": cold,
        "vacuumed_jobs_per_s_runs": warm,
        "ratio_unvacuumed_to_vacuumed": ratio,
        "met": ratio is not None and ratio >= TARGETS["burst_unvacuumed_ratio"],
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        when = "after VACUUM ANALYZE" if run["vacuumed"] else "right after enqueue"
        yield from drain_rows(f"burst {r['items']:,}, c{r['concurrency']}, {when},", run)
    cold, warm = r.get("unvacuumed_jobs_per_s_runs"), r.get("vacuumed_jobs_per_s_runs")
    how = "right after enqueue / after VACUUM ANALYZE"
    if cold and warm and len(cold) > 1:
        yield Row(
            "burst drains alternated, jobs/s: right after enqueue | after VACUUM ANALYZE",
            two_sides(cold, warm),
        )
        how = "median right after enqueue / median after VACUUM ANALYZE"
    yield Row(
        f"burst {how}",
        r["ratio_unvacuumed_to_vacuumed"],
        f">= {TARGETS['burst_unvacuumed_ratio']}",
        r["met"],
    )
