"""pickup: enqueue -> started_at with idle `runworker` processes woken by LISTEN/NOTIFY."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

from bench.common import progress, summary_ms, wait_for
from bench.config import TARGETS
from bench.context import Bench
from bench.report import Row, p50_p99


def ready_workers(bench: Bench, n: int) -> bool:
    running = bench.one("SELECT count(*) FROM workers WHERE role = 'worker' AND status = 'running'")
    return running >= n and bench.listening() >= n


def pickup(bench: Bench, n: int) -> dict[str, Any]:
    from leasing import enqueue

    bench.reset()
    bench.vacuum_analyze()
    procs = [bench.runworker(name=f"pickup-{n}-{i}") for i in range(n)]
    try:
        wait_for(lambda: ready_workers(bench, n), 60, f"{n} idle workers listening")
        warmup = 5
        lo, hi = bench.sizes.pickup_gap_ms
        for i in range(warmup + bench.sizes.pickup_items):
            enqueue(f"pickup-{i}", "bench.noop", input_data={"i": i})
            if i < warmup:
                wait_for(
                    lambda i=i: bench.one(
                        "SELECT count(*) FROM work_items WHERE task_id = %s "
                        "AND status = 'completed'",
                        [f"pickup-{i}"],
                    ),
                    10,
                    "a warm-up item",
                )
            time.sleep(random.uniform(lo, hi) / 1000)
        total = warmup + bench.sizes.pickup_items
        wait_for(
            lambda: (
                bench.one("SELECT count(*) FROM work_items WHERE status = 'completed'") >= total
            ),
            30,
            "every pickup item to complete",
            interval_s=0.05,
        )
        got = bench.sql(
            """
            SELECT extract(epoch FROM started_at - created_at) * 1000,
                   extract(epoch FROM completed_at - started_at) * 1000
            FROM work_items WHERE (input_data->>'i')::int >= %s
            """,
            [warmup],
        )
    finally:
        for proc in procs:
            bench.procs.stop(proc, grace_s=15)
    bench.check_exit(procs, "idle runworker")
    latencies = [float(r[0]) for r in got]
    return {
        "workers": n,
        "items": len(latencies),
        "pickup_ms": summary_ms(latencies, 2),
        "start_to_complete_ms": summary_ms([float(r[1]) for r in got], 2),
        "over_100ms": sum(1 for x in latencies if x > 100),
    }


def run(bench: Bench) -> dict[str, Any]:
    runs = []
    for n in bench.sizes.pickup_workers:
        progress(f"  {n} idle worker(s), {bench.sizes.pickup_items} single enqueues")
        result = pickup(bench, n)
        progress(f"    pickup ms {result['pickup_ms']}")
        runs.append(result)
    worst = max(r["pickup_ms"]["p50"] for r in runs)
    return {
        "measures": "started_at - created_at (database clock) of items enqueued one at a "
        "time with enqueue() every 20-50 ms, idle `runworker` (no options) processes woken "
        "by NOTIFY; 5 warm-up items excluded",
        "runs": runs,
        "worst_p50_ms": worst,
        "target_p50_ms": TARGETS["pickup_p50_ms"],
        "met": worst < TARGETS["pickup_p50_ms"],
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        met = run["pickup_ms"]["p50"] < TARGETS["pickup_p50_ms"]
        label = f"idle pickup ms, {run['workers']} worker(s) p50/p99"
        yield Row(label, p50_p99(run["pickup_ms"]), "p50 < 20", met, absolute=True)
