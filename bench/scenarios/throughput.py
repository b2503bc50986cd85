"""throughput: M no-op items drained by N real `runworker --burst` processes.

The processes run as a user who sets nothing runs them: default settings and
the project's default logging (INFO). The same drains at log level WARNING
beside them show what the default logging costs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bench.common import progress
from bench.config import RUNWORKER_OPTIONS, TARGETS
from bench.context import Bench
from bench.drain import drain_runworker
from bench.report import Row, p50_p99


def run(bench: Bench) -> dict[str, Any]:
    runs, warning = [], []
    for n in bench.sizes.workers:
        progress(f"  runworker x{n}: {bench.sizes.items} items, default logging")
        result = drain_runworker(bench, n, bench.sizes.items)
        progress(f"    {result['jobs_per_s']} jobs/s")
        runs.append(result)
    for n in bench.sizes.warning_workers:
        progress(f"  runworker x{n}: {bench.sizes.items} items, log level WARNING")
        result = drain_runworker(bench, n, bench.sizes.items, env=bench.env_warning)
        progress(f"    {result['jobs_per_s']} jobs/s")
        warning.append(result)
    record: dict[str, Any] = {
        "items": bench.sizes.items,
        "runworker_options": ["--burst", *RUNWORKER_OPTIONS],
        "runs": runs,
        "warning_runs": warning,
    }
    default_at = {r["workers"]: r["jobs_per_s"] for r in runs}
    costs = {
        w["workers"]: round(1 - default_at[w["workers"]] / w["jobs_per_s"], 3)
        for w in warning
        if w["workers"] in default_at and w["jobs_per_s"] and default_at[w["workers"]]
    }
    record["logging_cost"] = costs
    at = 4 if 4 in costs else max(costs, default=None)
    if at is not None:
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
    for n, cost in r.get("logging_cost", {}).items():
        is_target = n == r.get("logging_cost_at")
        yield Row(
            f"default logging cost x{n} (1 - INFO rate / WARNING rate)",
            f"{cost:.1%}",
            f"<= {TARGETS['logging_cost']:.0%}" if is_target else "",
            r.get("logging_cost_met") if is_target else None,
        )
