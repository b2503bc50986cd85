"""steady: a producer at 10%, 25%, 50% and 90% of the steady capacity while 4 workers run.

Four `runworker` processes (default settings, no --burst) wait, LISTENing; a
producer process (`bench.producer`) then enqueues at a fixed rate with
`enqueue_many()` every 10 ms. The steady capacity is measured first, the same
way: the producer asks for twice the drain capacity (runworker's jobs/s at 4
processes in the throughput scenario, or a drain measured here) for 16 s, and
the capacity is the items completed per second over its last 12; the
producer shares this host's CPUs with the workers and the server, so it is
below the drain capacity. Reported per load: enqueue->start and
enqueue->completion p50/p99 of every item (database clock) from the INSERT's
statement time (`created_at`), the start latency also by 10 s of enqueue
time, the wall time of the producer's `enqueue_many()` calls (no worker
sees an item before its call commits), the backlog (pending + in progress)
sampled every second, the rate the producer held, and the cost per job
(client CPU of the worker processes and database transactions, the
producer's own commits taken out) beside a drain's at the same process count
(the median of `throughput`'s alternated drains where it ran them).
Production runs autovacuum; where this server does not, the bench vacuums
`work_items` a second after each vacuum ends, as autovacuum with a one-second
`autovacuum_naptime` and the table's thresholds would (README, PostgreSQL
maintenance).
"""

from __future__ import annotations

import contextlib
import json
import time
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
from bench.scenarios.throughput import runworker_costs, runworker_rates

# Quiet at low rates (issue 43): at 10% of the steady capacity, at most this
# many transactions a job and this many times a drain's client CPU a job.
LOW_LOAD = 0.1
LOW_XACT_PER_JOB = 0.1
LOW_CPU_TO_DRAIN = 2.0
WINDOW_S = 10  # enqueue->start p50/p99 are also reported per window of this many seconds
BACKLOG = "SELECT count(*) FROM work_items WHERE status IN ('pending', 'in_progress')"
# The first quarter of the capacity run (4 of 16 s) starts from idle workers: not counted.
CAPACITY_SKIP_SHARE = 0.25
VACUUM_PAUSE_S = 1.0


def drain_capacity(bench: Bench, n: int) -> tuple[float, dict[str, Any]]:
    """The drain capacity at n processes and a drain's cost per job (client CPU, xact)."""
    # The median of throughput's alternated default drains where it has them:
    # one drain swung by a quarter, and "50%" of a fast outlier is nearer 60%
    # of the usual rate.
    # Their client CPU a job likewise: one drain's swung by a quarter from run to
    # run, and the low-load target is a ratio to it.
    throughput = bench.results.get("throughput", {})
    rates = runworker_rates(throughput).get(n)
    cpus = runworker_costs(throughput).get(n)
    drain = next((r for r in throughput.get("runs", []) if r["workers"] == n), None)
    if not (rates and all(rates) and cpus and all(cpus) and drain):
        progress(f"  measuring capacity: runworker x{n}, {bench.sizes.items} items")
        drain = drain_runworker(bench, n, bench.sizes.items)
        rates, cpus = [drain["jobs_per_s"]], [drain["client_cpu_us_per_job"]]
    cost = {
        "client_cpu_us_per_job": round(float(median(cpus)), 1),
        "xact_per_job": drain["xact_per_job"],
        "client_cpu_drains": len(cpus),
    }
    return float(median(rates)), cost


def run(bench: Bench) -> dict[str, Any]:
    n = bench.sizes.steady_workers
    drained, drain_cost = drain_capacity(bench, n)
    cap = steady_capacity(bench, n, 2 * drained)
    runs = [steady(bench, n, load, cap * load) for load in bench.sizes.steady_loads]
    for run in runs:
        cpu, drain_cpu = run["client_cpu_us_per_job"], drain_cost["client_cpu_us_per_job"]
        run["cpu_to_drain"] = round(cpu / drain_cpu, 2) if cpu and drain_cpu else None
    at_half = next((r for r in runs if r["load"] == 0.5), None)
    lowest = min(runs, key=lambda r: r["load"]) if runs else None
    record: dict[str, Any] = {
        "measures": __doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else "",
        "workers": n,
        "drain_capacity_jobs_per_s": drained,
        "drain_cost": drain_cost,
        "capacity_jobs_per_s": cap,
        "runs": runs,
        "start_p99_ms_at_half": at_half["enqueue_to_start_ms"]["p99"] if at_half else None,
    }
    if lowest is not None and lowest["load"] <= LOW_LOAD:
        xact, ratio = lowest["xact_per_job"], lowest["cpu_to_drain"]
        record.update(
            low_load=lowest["load"],
            low_load_xact_met=xact is not None and xact <= LOW_XACT_PER_JOB,
            low_load_cpu_met=ratio is not None and ratio <= LOW_CPU_TO_DRAIN,
        )
    return record


def steady_capacity(bench: Bench, n: int, rate: float) -> float:
    """Items completed a second while the producer asks for more than the workers take."""
    seconds = bench.sizes.steady_capacity_seconds
    produce(bench, n, "capacity", rate, seconds)
    done, window_s = bench.sql(
        """
        WITH span AS (SELECT min(created_at) + make_interval(secs => %s) AS t0,
                             max(created_at) AS t1 FROM work_items)
        SELECT (SELECT count(*) FROM work_items WHERE completed_at >= t0 AND completed_at < t1),
               extract(epoch FROM t1 - t0)
        FROM span
        """,
        [seconds * CAPACITY_SKIP_SHARE],
    )[0]
    return round(done / max(float(window_s), 1e-3), 1)


def steady(bench: Bench, n: int, load: float, rate: float) -> dict[str, Any]:
    run = produce(bench, n, f"{load:g}", rate, bench.sizes.steady_seconds)
    return {"load": load, **run, **latencies(bench)}


def produce(bench: Bench, n: int, label: str, rate: float, seconds: float) -> dict[str, Any]:
    """n idle workers, then the producer at `rate` for `seconds`, until the backlog is done."""
    bench.reset()
    bench.checkpoint()
    procs = [bench.runworker(name=f"steady-{label}-{i}") for i in range(n)]
    out = bench.log_dir / f"producer-{label}.json"
    try:
        wait_for(lambda: ready_workers(bench, n), 90, f"{n} idle workers listening")
        progress(f"  {label}: the producer asks {rate:.0f} items/s for {seconds:g} s, {n} workers")
        cpu0 = sum(proc_cpu_s(p.pid) for p in procs)
        xact0 = bench.xact_commits()
        producer, _ = bench.procs.spawn(
            [PYTHON, "-m", "bench.producer", str(out), "--rate", f"{rate:.1f}",
             "--seconds", str(seconds)],
            env=bench.env,
            name=f"producer-{label}",
        )  # fmt: skip
        sampler = Sampler(bench.url, {}, 1.0, lambda conn: conn.execute(BACKLOG).fetchone()[0])
        # Where the server runs no autovacuum, a sampler whose probe is a VACUUM
        # stands in for it: one a second after the one before ended.
        vacuums = None
        if bench.one("SHOW autovacuum") == "off":
            vacuums = Sampler(bench.url, {}, VACUUM_PAUSE_S, vacuum)
        with vacuums or contextlib.nullcontext(), sampler as s:
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
    for what, error in (("backlog sampler", s.error), ("vacuum", vacuums and vacuums.error)):
        if error is not None:
            raise BenchError(f"the {what} failed: {error}")
    return {
        "target_rate": round(rate, 1),
        "producer": made,
        "backlog": backlog_summary(s.series),
        "vacuums": vacuum_summary(vacuums),
        # The producer's own commits (one per enqueue_many() call) are the
        # enqueue's, not the workers': taken out, as a drain's enqueue is.
        **cost_per_job(bench, made["enqueued"], cpu1 - cpu0, xact0 + made["enqueue_ms"]["n"]),
    }


def vacuum(conn: Any) -> float:
    """`VACUUM work_items` (a `Sampler` probe); returns its seconds."""
    started = time.perf_counter()
    conn.execute("VACUUM work_items")
    return time.perf_counter() - started


def vacuum_summary(vacuums: Sampler | None) -> dict[str, Any]:
    if vacuums is None:
        return {"by": "autovacuum"}
    seconds = [v for _, v in vacuums.series]
    return {
        "by": "bench",
        "count": len(seconds),
        "median_s": rnd(median(seconds)) if seconds else None,
        "max_s": rnd(max(seconds)) if seconds else None,
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
    # By WINDOW_S of enqueue time: a start latency that climbs through the run
    # (dead claim-index entries piling up without a vacuum) shows here.
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
        f"steady state x{r['workers']}: capacity items/s (drain capacity)",
        f"{r['capacity_jobs_per_s']} ({r.get('drain_capacity_jobs_per_s')})",
    )
    for run in r["runs"]:
        load = f"  {run['load']:.0%} load"
        yield Row(
            f"{load}: rate held / asked",
            f"{run['producer']['rate']} / {run['target_rate']} items/s",
        )
        yield Row(
            f"{load}: enqueue->start p50/p99 ms",
            p50_p99(run["enqueue_to_start_ms"]),
            absolute=True,
        )
        yield Row(
            f"{load}: enqueue->start p50/p99 ms by {WINDOW_S} s window",
            ", ".join(p50_p99(w) for w in run["enqueue_to_start_ms_by_window"]),
        )
        yield Row(
            f"{load}: enqueue->completion p50/p99 ms",
            p50_p99(run["enqueue_to_completion_ms"]),
        )
        calls = run["producer"]["enqueue_ms"]
        yield Row(
            f"{load}: the producer's enqueue_many() p50/p99/max ms",
            f"{calls.get('p50')} / {calls.get('p99')} / {calls.get('max')}",
        )
        tail = [v for _, v in run["backlog"]["per_second"][-5:]]
        yield Row(f"{load}: backlog max, last 5 samples", f"{run['backlog']['max']}, {tail}")
        vac = run["vacuums"]
        if vac["by"] == "bench":
            yield Row(
                f"{load}: VACUUM work_items by the bench (count, median/max s)",
                f"{vac['count']}, {vac['median_s']}/{vac['max_s']}",
            )
        cost = r["drain_cost"]
        yield Row(
            f"{load}: client CPU us/job, xact/job (a drain's)",
            f"{run['client_cpu_us_per_job']}, {run['xact_per_job']} "
            f"({cost['client_cpu_us_per_job']}, {cost['xact_per_job']})",
        )
        if run["load"] == r.get("low_load"):
            yield Row(
                f"{load}: transactions per job",
                run["xact_per_job"],
                f"<= {LOW_XACT_PER_JOB:g}",
                r["low_load_xact_met"],
            )
            yield Row(
                f"{load}: client CPU per job / a drain's",
                run["cpu_to_drain"],
                f"<= {LOW_CPU_TO_DRAIN:g}",
                r["low_load_cpu_met"],
            )
