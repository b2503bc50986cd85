"""steady: a producer at 50% and 90% of measured capacity for 60 s while 4 workers run.

Capacity is runworker's jobs/s at 4 processes in this bench's throughput
scenario (the median of its alternated default-logging drains; or a drain of
M items measured here when that did not run). Four
`runworker` processes (default settings, no --burst) wait, LISTENing; a
producer process (`bench.producer`) then enqueues at the fixed rate with
`enqueue_many()` every 10 ms. Reported: enqueue->start and enqueue->completion
p50/p99 of every item (database clock), enqueue->start also by 10 s of enqueue
time, the backlog (pending + in progress)
sampled every second, the rate the producer held, and the cost per job.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from statistics import median
from typing import Any

from bench.common import PYTHON, BenchError, progress, wait_for
from bench.context import Bench
from bench.drain import cost_per_job, drain_runworker
from bench.measure import proc_cpu_s, rnd
from bench.report import Row, p50_p99
from bench.sampler import Sampler
from bench.scenarios.pickup import ready_workers
from bench.scenarios.throughput import runworker_rates

START_P99_MS = 20.0
WINDOW_S = 10  # enqueue->start p50/p99 are also reported per window of this many seconds
BACKLOG = "SELECT count(*) FROM work_items WHERE status IN ('pending', 'in_progress')"


def capacity(bench: Bench, n: int) -> float:
    # The median of throughput's alternated default drains where it has them:
    # one drain swung by a quarter, and "50%" of a fast outlier is nearer 60%
    # of the usual rate.
    rates = runworker_rates(bench.results.get("throughput", {})).get(n)
    if rates and all(rates):
        return float(median(rates))
    progress(f"  measuring capacity: runworker x{n}, {bench.sizes.items} items")
    return float(drain_runworker(bench, n, bench.sizes.items)["jobs_per_s"])


def run(bench: Bench) -> dict[str, Any]:
    n = bench.sizes.steady_workers
    cap = capacity(bench, n)
    runs = [steady(bench, n, load, cap * load) for load in bench.sizes.steady_loads]
    at_half = next((r for r in runs if r["load"] == 0.5), None)
    p99 = at_half["enqueue_to_start_ms"]["p99"] if at_half else None
    return {
        "measures": __doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else "",
        "workers": n,
        "capacity_jobs_per_s": cap,
        "runs": runs,
        "start_p99_ms_at_half": p99,
        "target_start_p99_ms": START_P99_MS,
        "met": p99 is not None and p99 < START_P99_MS,
    }


def steady(bench: Bench, n: int, load: float, rate: float) -> dict[str, Any]:
    seconds = bench.sizes.steady_seconds
    bench.reset()
    bench.checkpoint()
    procs = [bench.runworker(name=f"steady-{load:g}-{i}") for i in range(n)]
    out = bench.log_dir / f"producer-{load:g}.json"
    try:
        wait_for(lambda: ready_workers(bench, n), 90, f"{n} idle workers listening")
        progress(f"  load {load:.0%}: {rate:.0f} items/s for {seconds:g} s, {n} workers")
        cpu0 = sum(proc_cpu_s(p.pid) for p in procs)
        xact0 = bench.xact_commits()
        producer, _ = bench.procs.spawn(
            [PYTHON, "-m", "bench.producer", str(out), "--rate", f"{rate:.1f}",
             "--seconds", str(seconds)],
            env=bench.env,
            name=f"producer-{load:g}",
        )  # fmt: skip
        with Sampler(bench.url, {}, 1.0, lambda conn: conn.execute(BACKLOG).fetchone()[0]) as s:
            bench.procs.wait_all([producer], timeout_s=seconds + 60, what="producer")
            bench.check_exit([producer], "producer")
            made = json.loads(out.read_text())
            wait_for(
                lambda: bench.one(BACKLOG) == 0,
                max(60.0, made["enqueued"] / 500),
                "the workers to finish the backlog",
                interval_s=0.1,
            )
        cpu1 = sum(proc_cpu_s(p.pid) for p in procs)
    finally:
        for proc in procs:
            bench.procs.stop(proc, grace_s=15)
    bench.check_exit(procs, "runworker")
    if s.error is not None:
        raise BenchError(f"the backlog sampler failed: {s.error}")
    return {
        "load": load,
        "target_rate": round(rate, 1),
        "producer": made,
        **latencies(bench),
        "backlog": backlog_summary(s.series),
        **cost_per_job(bench, made["enqueued"], cpu1 - cpu0, xact0),
    }


def latencies(bench: Bench) -> dict[str, Any]:
    e2s, e2c, count = bench.sql(
        """
        SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
                   ORDER BY extract(epoch FROM started_at - created_at) * 1000),
               percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
                   ORDER BY extract(epoch FROM completed_at - created_at) * 1000),
               count(*) FILTER (WHERE status = 'completed')
        FROM work_items
        """
    )[0]
    # The same by WINDOW_S of enqueue time: without a vacuum the start latency
    # climbs through the run as claimed items' dead entries pile up at the
    # front of the claim index (BENCHMARKS.md), which one p99 hides.
    windows = bench.sql(
        f"""
        WITH first AS (SELECT min(created_at) AS t0 FROM work_items)
        SELECT floor(extract(epoch FROM created_at - t0) / {WINDOW_S})::int AS w,
               percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
                   ORDER BY extract(epoch FROM started_at - created_at) * 1000)
        FROM work_items, first
        GROUP BY 1 ORDER BY 1
        """
    )
    return {
        "completed": count,
        "enqueue_to_start_ms": {"p50": rnd(e2s[0]), "p99": rnd(e2s[1])},
        "enqueue_to_completion_ms": {"p50": rnd(e2c[0]), "p99": rnd(e2c[1])},
        "enqueue_to_start_ms_by_window": [
            {"from_s": w * WINDOW_S, "p50": rnd(q[0]), "p99": rnd(q[1])} for w, q in windows
        ],
    }


def backlog_summary(series: list[tuple[float, Any]]) -> dict[str, Any]:
    """The backlog each second (from the first sample) and its largest value."""
    if not series:
        return {"max": None, "per_second": []}
    t0 = series[0][0]
    return {
        "max": max(v for _, v in series),
        "per_second": [[round(t - t0, 1), v] for t, v in series],
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    yield Row(
        f"steady state x{r['workers']}: capacity jobs/s (throughput)", r["capacity_jobs_per_s"]
    )
    for run in r["runs"]:
        label = f"  {run['load']:.0%} load: rate held / asked"
        yield Row(label, f"{run['producer']['rate']} / {run['target_rate']} items/s")
        is_target = run["load"] == 0.5
        yield Row(
            f"  {run['load']:.0%} load: enqueue->start p50/p99 ms",
            p50_p99(run["enqueue_to_start_ms"]),
            f"p99 < {START_P99_MS:g}" if is_target else "",
            r["met"] if is_target else None,
            absolute=True,
        )
        by_window = run.get("enqueue_to_start_ms_by_window")
        if by_window:
            yield Row(
                f"  {run['load']:.0%} load: enqueue->start p50/p99 ms by {WINDOW_S} s window",
                ", ".join(p50_p99(w) for w in by_window),
            )
        yield Row(
            f"  {run['load']:.0%} load: enqueue->completion p50/p99 ms",
            p50_p99(run["enqueue_to_completion_ms"]),
        )
        tail = [v for _, v in run["backlog"]["per_second"][-5:]]
        yield Row(
            f"  {run['load']:.0%} load: backlog max, last 5 samples",
            f"{run['backlog']['max']}, {tail}",
        )
        yield Row(
            f"  {run['load']:.0%} load: client CPU us/job, xact/job",
            f"{run['client_cpu_us_per_job']}, {run['xact_per_job']}",
        )
