"""throughput: M no-op items drained by N real `runworker --burst` processes.

The processes run as a user who sets nothing runs them: default settings and
the project's default logging (INFO). The same drains at log level WARNING
beside them show what the default logging costs. At the target's process
count the two alternate `logging_repeats` times each and the cost is read
from their medians: one drain of the same items swung by a quarter either
way on this host, more than the 10% the target allows.
"""

from __future__ import annotations

from collections.abc import Iterator
from statistics import median
from typing import Any

from bench.common import progress
from bench.config import RUNWORKER_OPTIONS, TARGETS
from bench.context import Bench
from bench.drain import drain_runworker
from bench.report import Row, p50_p99, two_sides


def _drain(bench: Bench, n: int, warning: bool) -> dict[str, Any]:
    level = "log level WARNING" if warning else "default logging"
    progress(f"  runworker x{n}: {bench.sizes.items} items, {level}")
    env = bench.env_warning if warning else None
    result = drain_runworker(bench, n, bench.sizes.items, env=env)
    progress(f"    {result['jobs_per_s']} jobs/s")
    return result


def runworker_rates(throughput: dict[str, Any]) -> dict[int, list[float]]:
    """runworker's default-logging drains (jobs/s) by process count, from throughput.

    One drain per count, except where throughput alternated its drains: all of them.
    """
    return _by_workers(throughput, "jobs_per_s", "default")


def runworker_costs(throughput: dict[str, Any]) -> dict[int, list[float]]:
    """The client CPU a job (µs) of the same drains as `runworker_rates`."""
    return _by_workers(throughput, "client_cpu_us_per_job", "default_cpu_us_per_job")


def _by_workers(throughput: dict[str, Any], key: str, alternated: str) -> dict[int, list[float]]:
    values = {r["workers"]: [r[key]] for r in throughput.get("runs", [])}
    drains = throughput.get("logging_drains")
    if drains and alternated in drains:
        values[drains["workers"]] = list(drains[alternated])
    return values


def run(bench: Bench) -> dict[str, Any]:
    runs = [_drain(bench, n, False) for n in bench.sizes.workers]
    warning = [_drain(bench, n, True) for n in bench.sizes.warning_workers]
    record: dict[str, Any] = {
        "items": bench.sizes.items,
        "runworker_options": ["--burst", *RUNWORKER_OPTIONS],
        "runs": runs,
        "warning_runs": warning,
    }
    rates: dict[int, tuple[list[float], list[float]]] = {
        w["workers"]: (
            [r["jobs_per_s"] for r in runs if r["workers"] == w["workers"]],
            [w["jobs_per_s"]],
        )
        for w in warning
    }
    counted = [n for n, (default, _) in rates.items() if default]
    at = 4 if 4 in counted else max(counted, default=None)
    if at is not None:
        default, warned = rates[at]
        # Their client CPU too: the steady scenario's reference for a drain's cost.
        default_cpu = [r["client_cpu_us_per_job"] for r in runs if r["workers"] == at]
        for _ in range(bench.sizes.logging_repeats - 1):  # alternated, WARNING first
            warned.append(_drain(bench, at, True)["jobs_per_s"])
            drained = _drain(bench, at, False)
            default.append(drained["jobs_per_s"])
            default_cpu.append(drained["client_cpu_us_per_job"])
        record["logging_drains"] = {
            "workers": at,
            "default": default,
            "warning": warned,
            "default_cpu_us_per_job": default_cpu,
        }
    costs = {
        n: round(1 - median(default) / median(warned), 3)
        for n, (default, warned) in rates.items()
        if default and all(default) and all(warned)
    }
    record["logging_cost"] = costs
    if at is not None and at in costs:
        record["logging_cost_at"] = at
        record["logging_cost_met"] = costs[at] <= TARGETS["logging_cost"]
    return record


def drain_rows(label: str, run: dict[str, Any]) -> Iterator[Row]:
    """The lines of one drain: rate, enqueue->start latency, cost per job."""
    n = run["workers"]
    yield Row(
        f"{label} x{n} jobs/s (rows | wall)",
        f"{run['jobs_per_s']} | {run['wall_jobs_per_s']}",
        absolute=True,
    )
    yield Row(f"  x{n} enqueue->start p50/p99 ms", p50_p99(run["enqueue_to_start_ms"]))
    yield Row(
        f"  x{n} client CPU us/job, xact/job, machine busy %",
        f"{run['client_cpu_us_per_job']}, {run['xact_per_job']}, {run['machine_cpu_busy_pct']}",
    )


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        yield from drain_rows("runworker", run)
    for run in r.get("warning_runs", []):
        yield from drain_rows("runworker, log level WARNING,", run)
    drains = r.get("logging_drains")
    for n, cost in r.get("logging_cost", {}).items():
        is_target = n == r.get("logging_cost_at")
        how = "1 - INFO rate / WARNING rate"
        if is_target and drains and len(drains["default"]) > 1:
            how = "1 - median INFO / median WARNING rate"
            yield Row(
                f"  x{n} drains alternated, jobs/s: INFO | WARNING",
                two_sides(drains["default"], drains["warning"]),
            )
        yield Row(
            f"default logging cost x{n} ({how})",
            f"{cost:.1%}",
            f"<= {TARGETS['logging_cost']:.0%}" if is_target else "",
            r.get("logging_cost_met") if is_target else None,
        )
