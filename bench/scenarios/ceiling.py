"""ceiling: the same M items drained by N plain psycopg loops claiming K rows at a time.

K = 1 is the single-item loop (two commits a job); K = 10 and 100 claim and
complete that many rows per statement, the bar for a worker that batches. The
ratios compare runworker's throughput run of the same bench with each. At the
process count where throughput alternates its drains (4), runworker's side is
the median of its default-logging drains, and the batched loop drains
`ceiling_repeats` times: one drain of either swung by a quarter on this host,
so a ratio of two single drains moved 0.46-0.94x between runs of one commit.

Then the same K = 100 loop over a minimal queue table (`bench.ceiling.MINIMAL_DDL`:
id, status, priority, times, lease columns, one partial claim index), at the
same process counts and repeated the same way: the bar for `work_items` itself,
its columns and its indexes, and runworker's ratio to it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from statistics import median
from typing import Any

from bench.ceiling import CLAIM
from bench.common import progress
from bench.config import TARGETS
from bench.context import Bench
from bench.drain import drain_ceiling, drain_minimal
from bench.measure import walk_plan
from bench.report import Row, samples, two_sides
from bench.scenarios.throughput import runworker_rates


def run(bench: Bench) -> dict[str, Any]:
    runs = []
    library = runworker_rates(bench.results.get("throughput", {}))
    repeated = max(bench.sizes.ceiling_batches)
    for batch in bench.sizes.ceiling_batches:
        for n in bench.sizes.ceiling_workers:
            progress(f"  plain psycopg x{n}, batch {batch}: {bench.sizes.items} items")
            result = drain_ceiling(bench, n, bench.sizes.items, batch)
            loop = [result["jobs_per_s"]]
            ours = library.get(n, [])
            if batch == repeated and len(ours) > 1:
                for _ in range(bench.sizes.ceiling_repeats - 1):
                    loop.append(drain_ceiling(bench, n, bench.sizes.items, batch)["jobs_per_s"])
                result["loop_jobs_per_s_runs"] = loop
                result["runworker_jobs_per_s_runs"] = ours
            if ours and all(ours) and all(loop):
                result["ratio_runworker_to_ceiling"] = round(median(ours) / median(loop), 3)
            progress(
                f"    {samples(loop)} jobs/s, ratio {result.get('ratio_runworker_to_ceiling')}"
            )
            runs.append(result)
    minimal = []
    for n in bench.sizes.ceiling_workers:
        progress(
            f"  plain psycopg x{n}, batch {repeated}, minimal table: {bench.sizes.items} items"
        )
        result = drain_minimal(bench, n, bench.sizes.items, repeated)
        loop = [result["jobs_per_s"]]
        ours = library.get(n, [])
        if len(ours) > 1:
            for _ in range(bench.sizes.ceiling_repeats - 1):
                loop.append(drain_minimal(bench, n, bench.sizes.items, repeated)["jobs_per_s"])
            result["loop_jobs_per_s_runs"] = loop
            result["runworker_jobs_per_s_runs"] = ours
        if ours and all(ours) and all(loop):
            result["ratio_runworker_to_ceiling"] = round(median(ours) / median(loop), 3)
        progress(f"    {samples(loop)} jobs/s, ratio {result.get('ratio_runworker_to_ceiling')}")
        minimal.append(result)
    from bench.ceiling import MINIMAL_TABLE

    bench.sql(f"DROP TABLE IF EXISTS {MINIMAL_TABLE}")
    out_minimal: dict[str, Any] = {"minimal_runs": minimal}
    at4 = next((r for r in minimal if r["workers"] == 4), None)
    if at4 is not None and "ratio_runworker_to_ceiling" in at4:
        ratio = at4["ratio_runworker_to_ceiling"]
        out_minimal.update(
            ratio_minimal_n4=ratio, ratio_minimal_n4_met=ratio >= TARGETS["ratio_minimal_n4"]
        )
    return {
        "items": bench.sizes.items,
        **out_minimal,
        "claim_plan_indexes": claim_plan_indexes(bench),
        "measures": "jobs/s (rows) = M / (last completed_at - first started_at), database "
        "clock; ratio = runworker's jobs/s at the same N in this bench's throughput scenario "
        "(medians of both sides where either drained more than once)",
        "runs": runs,
        **_targets(runs),
    }


class _Rollback(Exception):
    pass


def claim_plan_indexes(bench: Bench) -> list[str | None]:
    """The indexes the loop's claim (K=100) scans, under its planner settings.

    The loop is only a fair bar while it walks one of the engine's claim
    indexes (`work_items_claim_idx`, or the type-led `work_items_claim_type_idx`,
    as its claim names one work type): a claim that misses the indexes'
    predicate (say, a new column in it) sorts every pending row and makes the
    loop, and every ratio to it, meaningless.
    """
    statements = [s.strip() for s in CLAIM.format(batch=100).split(";") if s.strip()]
    query = statements[-1]
    params = {"holder": "explain", "lease": 300.0, "work_type": "bench.noop"}
    scans: list[dict[str, Any]] = []
    with contextlib.suppress(_Rollback):
        from django.db import transaction

        with transaction.atomic():
            for setting in statements[:-1]:
                bench.sql(setting)
            plan = bench.sql("EXPLAIN (FORMAT JSON) " + query, params)
            doc = plan[0][0]
            doc = json.loads(doc) if isinstance(doc, str) else doc
            walk_plan(doc[0]["Plan"], scans)
            raise _Rollback
    return [scan["index"] for scan in scans]


def _targets(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, batch, n in (("ratio_n1", 1, 1), ("ratio_n4", 1, 4), ("ratio_batched_n4", 100, 4)):
        ratio = next(
            (
                r.get("ratio_runworker_to_ceiling")
                for r in runs
                if r["batch"] == batch and r["workers"] == n
            ),
            None,
        )
        if ratio is not None:
            out[key] = ratio
            out[f"{key}_met"] = ratio >= TARGETS[key]
    return out


def rows(r: dict[str, Any]) -> Iterator[Row]:
    targets = {(1, 1): "ratio_n1", (1, 4): "ratio_n4", (100, 4): "ratio_batched_n4"}
    for run in r["runs"]:
        n, k = run["workers"], run["batch"]
        capped = f" (stopped after {run['completed']:,} items)" if run.get("capped") else ""
        yield Row(
            f"psycopg loop K={k} x{n} jobs/s (rows | wall)",
            f"{run['jobs_per_s']} | {run['wall_jobs_per_s']}{capped}",
        )
        yield Row(
            f"  K={k} x{n} client CPU us/job, xact/job, machine busy %",
            f"{run['client_cpu_us_per_job']}, {run['xact_per_job']}, {run['machine_cpu_busy_pct']}",
        )
        ratio = run.get("ratio_runworker_to_ceiling")
        if ratio is None:
            continue
        key = targets.get((k, n))
        label = f"  ratio runworker/loop K={k} x{n}"
        if "loop_jobs_per_s_runs" in run:
            yield Row(
                f"  K={k} x{n} drains, jobs/s: runworker | loop",
                two_sides(run["runworker_jobs_per_s_runs"], run["loop_jobs_per_s_runs"]),
            )
            label += " (median / median)"
        if key:
            yield Row(label, ratio, f">= {TARGETS[key]}", r[f"{key}_met"])
        else:
            yield Row(label, ratio)
    for run in r.get("minimal_runs", []):
        n, k = run["workers"], run["batch"]
        capped = f" (stopped after {run['completed']:,} items)" if run.get("capped") else ""
        yield Row(
            f"psycopg loop K={k} x{n}, minimal table, jobs/s (rows | wall)",
            f"{run['jobs_per_s']} | {run['wall_jobs_per_s']}{capped}",
        )
        yield Row(
            f"  minimal K={k} x{n} client CPU us/job, xact/job",
            f"{run['client_cpu_us_per_job']}, {run['xact_per_job']}",
        )
        ratio = run.get("ratio_runworker_to_ceiling")
        if ratio is None:
            continue
        label = f"  ratio runworker/minimal-table loop K={k} x{n}"
        if "loop_jobs_per_s_runs" in run:
            yield Row(
                f"  minimal K={k} x{n} drains, jobs/s: runworker | loop",
                two_sides(run["runworker_jobs_per_s_runs"], run["loop_jobs_per_s_runs"]),
            )
            label += " (median / median)"
        if n == 4:
            target = TARGETS["ratio_minimal_n4"]
            yield Row(label, ratio, f">= {target}", r["ratio_minimal_n4_met"])
        else:
            yield Row(label, ratio)
