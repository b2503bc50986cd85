"""ratelimit: one rate key limited to 50 a second, held by eight worker processes.

K items (default 4,000) of rate key `hot` wait; W (default 8) `runworker`
processes drain them under `RATE_LIMITS = {"key:hot": 50/s, burst 75}` for
S seconds (default 32) from the first admission. Figures from the claim
times (the instants the bucket admitted each item, database clock): the
admitted rate over the S - 2 seconds from one second after the first
admission (that second holds the initial burst), and the most admitted in
any window of one second. Targets: the rate within 5% of 50 a second, no
second above the burst.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from bench.common import BenchError, progress, wait_for
from bench.context import Bench
from bench.report import Row

RATE = 50
BURST = 75
TOLERANCE = 0.05


def run(bench: Bench) -> dict[str, Any]:
    from leasing import enqueue_many

    quick = bench.args.quick
    items = 400 if quick else 4_000
    seconds = 5.0 if quick else 32.0
    workers = 2 if quick else 8
    bench.reset()
    bench.sql("TRUNCATE leasing_rate_buckets")
    enqueue_many(
        {"task_id": f"hot-{i}", "work_type": "bench.noop", "rate_key": "hot"} for i in range(items)
    )
    bench.checkpoint()
    limit = {"limit": RATE, "per": 1, "burst": BURST}
    progress(f"  {workers} workers, {items} items of one key at {RATE}/s for {seconds:g} s")
    procs = [
        bench.runworker(
            name=f"ratelimit-{i}",
            env=bench.env_warning,
            leasing={"RATE_LIMITS": {"key:hot": limit}},
        )
        for i in range(workers)
    ]
    try:
        # S seconds from the first admission, not from the spawn: the window
        # starts a second after that admission, and a start-up of a few
        # seconds (a slow phase) would otherwise cut its end short.
        wait_for(
            lambda: bench.one("SELECT count(*) FROM work_items WHERE started_at IS NOT NULL"),
            120,
            "the first admission",
            0.05,
        )
        time.sleep(seconds)
    finally:
        for proc in procs:
            bench.procs.stop(proc)
    stamps = [
        row[0]
        for row in bench.sql(
            "SELECT extract(epoch FROM started_at)::float8 FROM work_items "
            "WHERE started_at IS NOT NULL ORDER BY started_at"
        )
    ]
    if len(stamps) < 2:
        raise BenchError("the rate-limited key admitted fewer than two items")
    start = stamps[0] + 1.0
    window = max(0.5, stamps[-1] - start) if quick else seconds - 2.0
    admitted = [s for s in stamps if start <= s < start + window]
    rate = len(admitted) / window
    busiest, first = 0, 0
    for last, stamp in enumerate(stamps):
        while stamp - stamps[first] >= 1.0:
            first += 1
        busiest = max(busiest, last - first + 1)
    return {
        "measures": "items admitted per second by one key's bucket (claim times, database clock) "
        "after the first second, and the most admitted in any one-second window",
        "workers": workers,
        "items": items,
        "limit_per_s": RATE,
        "burst": BURST,
        "window_s": round(window, 3),
        "admitted": len(admitted),
        "admitted_per_s": round(rate, 2),
        "busiest_second": busiest,
        "rate_met": abs(rate - RATE) <= TOLERANCE * RATE,
        "burst_met": busiest <= BURST,
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    yield Row(
        f"rate limit {RATE}/s x{r['workers']} workers: admitted/s over {r['window_s']:g} s",
        r["admitted_per_s"],
        f"{RATE} +/- {TOLERANCE:.0%}",
        r["rate_met"],
    )
    yield Row("  most admitted in one second", r["busiest_second"], f"<= {BURST}", r["burst_met"])
