"""claim: `acquire_leases()` latency in concurrent claimer processes, plus EXPLAIN ANALYZE."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from bench.common import PYTHON, progress, summary_ms
from bench.config import TARGETS
from bench.context import Bench
from bench.drain import gate_and_start
from bench.measure import walk_plan
from bench.report import Row, p50_p99


def claimers(
    bench: Bench,
    count_of: int,
    batch: int,
    count: int,
    think_ms: float = 0.0,
    *,
    fresh: bool = True,
) -> dict[str, Any]:
    """`count_of` bench.claimer processes making `count` timed claims of `batch` each.

    `fresh`: into an emptied table, enough pending items are enqueued (then
    VACUUM ANALYZE); otherwise the claimers take the table's own pending items.
    """
    if fresh:
        bench.reset()
        bench.enqueue_noop(count_of * batch * (count + 1) + 1000)
        bench.vacuum_analyze()
    bench.checkpoint()
    explain_before = explain_claim(bench, batch)
    outs = []

    def spawn(i: int) -> Any:
        out = bench.log_dir / f"claim-{count_of}x{batch}-{think_ms:g}-{i}.json"
        outs.append(out)
        args = [PYTHON, "-m", "bench.claimer", f"claimer-{i}", str(out), "--batch",
                str(batch), "--count", str(count), "--think-ms", str(think_ms)]  # fmt: skip
        return bench.procs.spawn(args, env=bench.env, name=f"claimer-{count_of}x{batch}-{i}")[0]

    # The same gate as the drains: every claimer blocks on its first
    # (untimed) claim until all are ready, then they start together.
    procs = gate_and_start(bench, count_of, "claimer", spawn)
    bench.procs.wait_all(procs, timeout_s=120, what="claimer")
    bench.check_exit(procs, "claimer")
    durations = []
    for out in outs:
        durations += [ns / 1e6 for ns in json.loads(out.read_text())["durations_ns"]]
    explain_after = explain_claim(bench, batch)
    return {
        "claimers": count_of,
        "batch": batch,
        "think_ms": think_ms,
        "claim_ms": summary_ms(durations, 3),
        "server_explain_ms_fresh_backlog": explain_before,
        "server_explain_ms_after_drain": explain_after,
    }


class _Rollback(Exception):
    pass


def explain_claim(bench: Bench, batch: int) -> dict[str, Any] | None:
    """EXPLAIN ANALYZE of the very claim statement acquire_leases sends (rolled back)."""
    from django.db import connection, transaction

    from leasing import LeaseManager

    captured: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        captured.append((sql, params))
        return execute(sql, params, many, context)

    with contextlib.suppress(_Rollback), transaction.atomic():
        with connection.execute_wrapper(capture):
            LeaseManager("explain").acquire_leases(batch, 300, work_type_filter=["bench.noop"])
        raise _Rollback
    claim = next((c for c in captured if "SKIP LOCKED" in c[0]), None)
    if claim is None:
        return None
    # The claim is sent with its planner settings around it (SET LOCAL ...;
    # claim; SET LOCAL ... TO DEFAULT): explain the claim under those settings.
    statements = [part.strip() for part in claim[0].split(";") if part.strip()]
    settings = [part for part in statements if part.upper().startswith("SET LOCAL")]
    query = next(part for part in statements if not part.upper().startswith("SET LOCAL"))
    with contextlib.suppress(_Rollback), transaction.atomic():
        for setting in settings:
            if "TO DEFAULT" not in setting.upper():
                bench.sql(setting)
        plan = bench.sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, claim[1])
        raise _Rollback
    doc = plan[0][0]
    doc = json.loads(doc) if isinstance(doc, str) else doc
    top = doc[0]
    scans: list[dict[str, Any]] = []
    walk_plan(top["Plan"], scans)
    return {
        "execution_ms": round(top["Execution Time"], 3),
        "planning_ms": round(top["Planning Time"], 3),
        "shared_buffers_hit": top["Plan"].get("Shared Hit Blocks"),
        "scans": scans,
    }


def run(bench: Bench) -> dict[str, Any]:
    count, batch_count = bench.sizes.claim_count, bench.sizes.claim_batch_count
    runs = []
    plan = [(1, 1, count, 0.0), (4, 1, count, 0.0), (4, 1, count, 5.0)]
    if not bench.args.quick:
        plan.append((4, 32, batch_count, 0.0))
    for count_of, batch, n, think in plan:
        progress(f"  {count_of} claimer(s), batch {batch}, think {think} ms, {n} claims each")
        result = claimers(bench, count_of, batch, n, think)
        progress(f"    claim ms {result['claim_ms']}")
        runs.append(result)
    for result in runs:
        p99 = result["claim_ms"].get("p99")
        result["met"] = p99 is not None and p99 < TARGETS["claim_p99_ms"]
    saturated = next(
        r for r in runs if r["claimers"] == 4 and r["batch"] == 1 and not r["think_ms"]
    )
    paced = next(r for r in runs if r["claimers"] == 4 and r["batch"] == 1 and r["think_ms"])
    return {
        "measures": "client-side duration of LeaseManager.acquire_leases(batch, 300, "
        "work_type_filter=['bench.noop']) per call in concurrent claimer processes that "
        "complete what they claim in one batch (then pause think_ms); plus EXPLAIN "
        "ANALYZE of the claim SQL before and after the drain",
        "runs": runs,
        "p99_ms_4_claimers_saturated": saturated["claim_ms"].get("p99"),
        "p99_ms_4_claimers_paced": paced["claim_ms"].get("p99"),
        "target_p99_ms": TARGETS["claim_p99_ms"],
        "met": saturated["met"] and paced["met"],
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        is_target = run["claimers"] == 4 and run["batch"] == 1
        think = f" think {run['think_ms']:g} ms" if run["think_ms"] else " flat out"
        yield Row(
            f"claim ms, {run['claimers']} claimer(s) batch {run['batch']}{think} p50/p99",
            p50_p99(run["claim_ms"]),
            "p99 < 5" if is_target else "",
            run.get("met") if is_target else None,
            absolute=True,
        )
