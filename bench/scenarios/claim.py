"""claim: `acquire_leases()` latency in concurrent claimer processes, plus EXPLAIN ANALYZE.

Also the cost of the claim's pause check: the shipped claim against the same
statement with the check removed (`pause_check_cost`).
"""

from __future__ import annotations

import contextlib
import json
import statistics
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
    without_pause_check: bool = False,
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
        variant = "-plain" if without_pause_check else ""
        out = bench.log_dir / f"claim-{count_of}x{batch}-{think_ms:g}{variant}-{i}.json"
        outs.append(out)
        args = [PYTHON, "-m", "bench.claimer", f"claimer-{i}", str(out), "--batch",
                str(batch), "--count", str(count), "--think-ms", str(think_ms)]  # fmt: skip
        if without_pause_check:
            args.append("--without-pause-check")
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


@contextlib.contextmanager
def pause_check_removed(removed: bool = True) -> Iterator[None]:
    """In this process, claims built meanwhile have no pause check (the baseline)."""
    import leasing.sql.work_items as statements

    shipped = statements.not_paused
    if removed:
        statements.not_paused = lambda d: "TRUE"
    try:
        yield
    finally:
        statements.not_paused = shipped


def explain_claim(
    bench: Bench, batch: int, *, without_pause_check: bool = False
) -> dict[str, Any] | None:
    """EXPLAIN ANALYZE of the very claim statement acquire_leases sends (rolled back)."""
    from django.db import connection, transaction

    from leasing import LeaseManager

    captured: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        captured.append((sql, params))
        return execute(sql, params, many, context)

    with contextlib.suppress(_Rollback), transaction.atomic():
        with connection.execute_wrapper(capture), pause_check_removed(without_pause_check):
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


PAUSE_CHECK_ROUNDS = 3  # alternations of (shipped claim, claim without the pause check)
PAUSE_CHECK_EXPLAINS = 30
# "No slower": the shipped claim's median within run-to-run noise of the baseline's.
PAUSE_CHECK_MAX_RATIO = 1.05


def pause_check_cost(bench: Bench, count: int) -> dict[str, Any]:
    """The claim as shipped against the same claim without its pause check.

    One claimer, batch 1 (no CPU contention between claimers), the two
    variants alternated `PAUSE_CHECK_ROUNDS` times so that drift of the host
    falls on both; the client-side p50 of each run, and the server's planning
    and execution time of each statement (EXPLAIN ANALYZE, interleaved).
    """
    p50s: dict[str, list[float]] = {"shipped": [], "without": []}
    for _ in range(PAUSE_CHECK_ROUNDS):
        for variant in ("shipped", "without"):
            result = claimers(bench, 1, 1, count, without_pause_check=variant == "without")
            p50s[variant].append(result["claim_ms"]["p50"])
    bench.reset()
    bench.enqueue_noop(5_000)
    bench.vacuum_analyze()
    server: dict[str, dict[str, list[float]]] = {
        v: {"planning_ms": [], "execution_ms": []} for v in p50s
    }
    for _ in range(PAUSE_CHECK_EXPLAINS):
        for variant in p50s:
            plan = explain_claim(bench, 1, without_pause_check=variant == "without")
            for key in ("planning_ms", "execution_ms"):
                server[variant][key].append(plan[key] if plan else float("nan"))
    shipped, without = statistics.median(p50s["shipped"]), statistics.median(p50s["without"])
    ratio = shipped / without
    return {
        "client_p50_ms": {"shipped": p50s["shipped"], "without": p50s["without"]},
        "client_p50_ms_median": {"shipped": shipped, "without": without},
        "ratio": round(ratio, 3),
        "server_median_ms": {
            v: {k: round(statistics.median(xs), 3) for k, xs in figures.items()}
            for v, figures in server.items()
        },
        "target_max_ratio": PAUSE_CHECK_MAX_RATIO,
        "met": ratio <= PAUSE_CHECK_MAX_RATIO,
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
        "pause_check": pause_check_cost(bench, count),
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
    check = r.get("pause_check")
    if check:
        client, server = check["client_p50_ms_median"], check["server_median_ms"]
        yield Row(
            "claim p50 ms, 1 claimer: as shipped / without the pause check",
            f"{client['shipped']} / {client['without']} (ratio {check['ratio']})",
            f"ratio <= {check['target_max_ratio']}",
            check["met"],
        )
        yield Row(
            "  server planning + execution ms: as shipped / without",
            f"{server['shipped']['planning_ms']} + {server['shipped']['execution_ms']} / "
            f"{server['without']['planning_ms']} + {server['without']['execution_ms']}",
        )
