"""fairness: tenant A's backlog and tenant B's trickle in one fair queue (LEASING FAIR_QUEUES).

Tenant A has A items (default 200,000) waiting in the queue `tenants`; W
(default 4) `runworker --queue tenants` processes drain it while tenant B
enqueues 10 items a second for D seconds (default 20). Two runs:

* fair: the items carry `fairness_key` "a" / "b" and the queue is in
  `FAIR_QUEUES`, so claims take turns across the two keys;
* plain: no keys, no fair queues (B waits behind A's backlog in claim order).

Figures from the rows' own timestamps (database clock): B's enqueue-to-start
p50/p99 in each run, and the items started per second while A's backlog
lasted. Targets: B's p99 under 1 s with fairness, and the fair run's
throughput at least 0.9x the plain run's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from bench.common import BenchError, progress, wait_for
from bench.context import Bench
from bench.measure import rnd
from bench.report import Row

QUEUE = "tenants"
B_PER_SECOND = 10
P99_TARGET_MS = 1000.0
THROUGHPUT_TARGET = 0.9


def run(bench: Bench) -> dict[str, Any]:
    quick = bench.args.quick
    backlog = 5_000 if quick else 200_000
    seconds = 3.0 if quick else 20.0
    workers = 2 if quick else 4
    runs = {
        label: _run(bench, label == "fair", backlog, seconds, workers)
        for label in ("plain", "fair")
    }
    ratio = (
        round(runs["fair"]["jobs_per_s"] / runs["plain"]["jobs_per_s"], 3)
        if runs["plain"]["jobs_per_s"]
        else None
    )
    p99 = runs["fair"]["b_enqueue_to_start_ms"]["p99"]
    return {
        "measures": "tenant B's enqueue-to-start (started_at - created_at) behind tenant A's "
        "backlog, and items started per second while the backlog lasted, fair and plain",
        "backlog": backlog,
        "seconds": seconds,
        "workers": workers,
        "runs": runs,
        "throughput_ratio_fair_to_plain": ratio,
        "p99_met": p99 is not None and p99 < P99_TARGET_MS,
        "throughput_met": ratio is not None and ratio >= THROUGHPUT_TARGET,
    }


def _run(bench: Bench, fair: bool, backlog: int, seconds: float, workers: int) -> dict[str, Any]:
    from leasing import enqueue_many

    bench.reset()
    key_a = "a" if fair else None
    progress(f"  {'fair' if fair else 'plain'}: {backlog} items of tenant A")
    for start in range(0, backlog, 100_000):
        enqueue_many(
            {
                "task_id": f"a-{i}",
                "work_type": "bench.noop",
                "queue_name": QUEUE,
                "fairness_key": key_a,
            }
            for i in range(start, min(backlog, start + 100_000))
        )
    bench.vacuum_analyze()
    bench.checkpoint()
    leasing = {"FAIR_QUEUES": [QUEUE]} if fair else {}
    procs = [
        bench.runworker(
            "--queue", QUEUE, name=f"fairness-{i}", env=bench.env_warning, leasing=leasing
        )
        for i in range(workers)
    ]
    try:
        # B's clock starts once every worker runs and A's backlog is being drained.
        wait_for(
            lambda: (
                bench.one("SELECT count(*) FROM workers") >= workers
                and bench.one("SELECT count(started_at) FROM work_items") > 0
            ),
            timeout_s=120.0,
            what="the workers to start",
        )
        started = time.monotonic()
        sent = 0
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(elapsed * B_PER_SECOND) + 1
            if due > sent:
                enqueue_many(
                    {
                        "task_id": f"b-{i}",
                        "work_type": "bench.noop",
                        "queue_name": QUEUE,
                        "fairness_key": "b" if fair else None,
                    }
                    for i in range(sent, due)
                )
                sent = due
            time.sleep(max(0.0, (sent / B_PER_SECOND) - (time.monotonic() - started)))
        time.sleep(1.0)  # B's last items get their turn
    finally:
        for proc in procs:
            bench.procs.stop(proc)
    b_row = bench.sql(
        """
        SELECT count(*), count(started_at),
               percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
                   ORDER BY extract(epoch FROM COALESCE(started_at, clock_timestamp())
                                               - created_at) * 1000)
        FROM work_items WHERE task_id LIKE 'b-%%'
        """
    )[0]
    a_row = bench.sql(
        """
        SELECT count(*) FILTER (WHERE started_at IS NOT NULL),
               extract(epoch FROM max(started_at) - min(started_at))
        FROM work_items WHERE task_id LIKE 'a-%%'
        """
    )[0]
    b_total, b_started, b_lat = b_row
    a_started, a_span = a_row
    if not a_started:
        raise BenchError("no item of tenant A started")
    span = float(a_span or 0.0)
    return {
        "b_enqueued": b_total,
        "b_started": b_started,
        "b_enqueue_to_start_ms": {"p50": rnd(b_lat and b_lat[0]), "p99": rnd(b_lat and b_lat[1])},
        "a_started": a_started,
        "a_backlog_left": backlog - a_started,
        "jobs_per_s": round((a_started + b_started) / span, 1) if span > 0 else None,
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    fair, plain = r["runs"]["fair"], r["runs"]["plain"]
    yield Row(
        f"fairness, {r['backlog']:,} of A + B at {B_PER_SECOND}/s: B start p99 ms (fair)",
        fair["b_enqueue_to_start_ms"]["p99"],
        f"< {P99_TARGET_MS:g} ms",
        r["p99_met"],
    )
    yield Row("  B start p99 ms without fairness keys", plain["b_enqueue_to_start_ms"]["p99"])
    yield Row(
        "  jobs/s fair / plain (ratio)",
        f"{fair['jobs_per_s']} / {plain['jobs_per_s']} ({r['throughput_ratio_fair_to_plain']})",
        f">= {THROUGHPUT_TARGET:g}x",
        r["throughput_met"],
    )
