"""ceiling: the same M items drained by N plain psycopg claim/complete loops; the ratio."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bench.common import progress
from bench.config import TARGETS
from bench.context import Bench
from bench.drain import drain_ceiling
from bench.report import Row


def run(bench: Bench) -> dict[str, Any]:
    runs = []
    library = {r["workers"]: r for r in bench.results.get("throughput", {}).get("runs", [])}
    for n in bench.sizes.workers:
        progress(f"  plain psycopg x{n}: {bench.sizes.items} items")
        result = drain_ceiling(bench, n, bench.sizes.items)
        lib = library.get(n)
        if lib and lib.get("jobs_per_s") and result.get("jobs_per_s"):
            result["ratio_runworker_to_ceiling"] = round(
                lib["jobs_per_s"] / result["jobs_per_s"], 3
            )
            result["ratio_wall"] = round(lib["wall_jobs_per_s"] / result["wall_jobs_per_s"], 3)
        progress(
            f"    {result['jobs_per_s']} jobs/s, ratio {result.get('ratio_runworker_to_ceiling')}"
        )
        runs.append(result)
    return {"items": bench.sizes.items, "runs": runs}


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        n = run["workers"]
        ratio = run.get("ratio_runworker_to_ceiling")
        target, met = "", None
        if ratio is not None and n in (1, 4):
            need = TARGETS["ratio_n4"] if n == 4 else TARGETS["ratio_n1"]
            target, met = f">= {need}", ratio >= need
        yield Row(
            f"psycopg loop x{n} jobs/s (rows | wall)",
            f"{run['jobs_per_s']} | {run['wall_jobs_per_s']}",
        )
        yield Row(
            f"  x{n} client CPU ms/job, machine busy %",
            f"{run['client_cpu_ms_per_job']}, {run['machine_cpu_busy_pct']}",
        )
        if ratio is not None:
            yield Row(f"  ratio runworker/psycopg x{n} (rows)", ratio, target, met)
