"""claim: `acquire_leases()` latency in concurrent claimer processes, plus EXPLAIN ANALYZE.

Also the host's control (`host_control`: the minimal table's claim timed the
same way, what the host alone does to a claim's tail under contention) and
the cost of the claim's pause check: the shipped claim against the same
statement with the check removed (`pause_check_cost`).
"""

from __future__ import annotations

import contextlib
import json
import statistics
from collections.abc import Iterator
from typing import Any

from bench.ceiling import MINIMAL_TABLE
from bench.common import PYTHON, progress, summary_ms
from bench.config import TARGETS
from bench.context import Bench
from bench.drain import drain_runworker, fill_minimal, gate_and_start
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
    alternate_pause_check: bool = False,
    minimal: bool = False,
) -> dict[str, Any]:
    """`count_of` bench.claimer processes making `count` timed claims of `batch` each.

    `fresh`: into an emptied table, enough pending items are enqueued (then
    VACUUM ANALYZE); otherwise the claimers take the table's own pending items.
    `minimal`: the claimers time the minimal queue table's claim instead
    (`bench.ceiling.MINIMAL_TABLE`, filled the same way), the host's control.
    """
    needed = count_of * batch * (count + 1) + 1000
    if minimal:
        fill_minimal(bench, needed)
    elif fresh:
        bench.reset()
        bench.enqueue_noop(needed)
        bench.vacuum_analyze()
    bench.checkpoint()
    explain_before = None if minimal else explain_claim(bench, batch)
    outs = []
    variant = ""
    if minimal:
        variant = "-minimal"
    elif without_pause_check:
        variant = "-plain"
    elif alternate_pause_check:
        variant = "-ab"

    def spawn(i: int) -> Any:
        out = bench.log_dir / f"claim-{count_of}x{batch}-{think_ms:g}{variant}-{i}.json"
        outs.append(out)
        args = [PYTHON, "-m", "bench.claimer", f"claimer-{i}", str(out), "--batch",
                str(batch), "--count", str(count), "--think-ms", str(think_ms)]  # fmt: skip
        if without_pause_check:
            args.append("--without-pause-check")
        if alternate_pause_check:
            args.append("--alternate-pause-check")
        if minimal:
            args.append("--minimal")
        return bench.procs.spawn(args, env=bench.env, name=f"claimer-{count_of}x{batch}-{i}")[0]

    # The same gate as the drains: every claimer blocks on its first
    # (untimed) claim until all are ready, then they start together.
    table = MINIMAL_TABLE if minimal else "work_items"
    procs = gate_and_start(bench, count_of, "claimer", spawn, table=table)
    bench.procs.wait_all(procs, timeout_s=120, what="claimer")
    bench.check_exit(procs, "claimer")
    durations = []
    by_variant: dict[str, list[float]] = {}
    for out in outs:
        record = json.loads(out.read_text())
        durations += [ns / 1e6 for ns in record["durations_ns"]]
        for name, values in record.get("durations_ns_by_variant", {}).items():
            by_variant.setdefault(name, []).extend(ns / 1e6 for ns in values)
    explain_after = None if minimal else explain_claim(bench, batch)
    return {
        "claimers": count_of,
        "batch": batch,
        "think_ms": think_ms,
        "claim_ms": summary_ms(durations, 3),
        "server_explain_ms_fresh_backlog": explain_before,
        "server_explain_ms_after_drain": explain_after,
        "claim_ms_by_variant": {name: summary_ms(v, 3) for name, v in by_variant.items()},
    }


def host_control(bench: Bench, count: int, saturated: dict[str, Any]) -> dict[str, Any]:
    """The minimal table's 1-row claim, flat out, by 1 and then 4 claimers: its p99 ratio,
    and the engine's flat-out ratio (`saturated`, same run) over it.

    What four busy processes on this host do to a short claim's tail whatever
    the claim is: the statement is the least a claim can be, so the engine's
    own ratio above it is what its claim adds.
    """
    p99 = {}
    for count_of in (1, 4):
        progress(f"  host control: {count_of} claimer(s) of the minimal table, batch 1")
        result = claimers(bench, count_of, 1, count, minimal=True)
        progress(f"    claim ms {result['claim_ms']}")
        p99[count_of] = result["claim_ms"]
    one, four = p99[1].get("p99"), p99[4].get("p99")
    host = round(four / one, 2) if one and four else None
    ours = saturated.get("p99_ratio_to_one_claimer")
    return {
        "claim_ms_1": p99[1],
        "claim_ms_4": p99[4],
        "p99_ratio_4_to_1": host,
        "engine_ratio_over_control": round(ours / host, 2) if ours and host else None,
    }


class _Rollback(Exception):
    pass


def explain_claim(
    bench: Bench, batch: int, *, without_pause_check: bool = False
) -> dict[str, Any] | None:
    """EXPLAIN ANALYZE of the very claim statement acquire_leases sends (rolled back)."""
    from django.db import connection, transaction

    from bench.pausecheck import pause_check_removed
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


# "No slower": the worker's throughput with the check within the run-to-run
# noise of the drains (5%) of its throughput without.
PAUSE_CHECK_MIN_THROUGHPUT_RATIO = 0.95


def pause_check_cost(bench: Bench) -> dict[str, Any]:
    """The claim as shipped against the same claim without its pause check.

    * The worker's claim path, the target: `runworker --burst` processes
      draining the same items with and without the check, alternated
      (BENCH_WITHOUT_PAUSE_CHECK=1 removes it in the workers).
    * One single-item claim: one claimer process, batch 1, alternating the
      two statements claim by claim (`bench.claimer --alternate-pause-check`),
      so that drift of the host falls on both alike; plus the server's
      planning and execution time of each statement (EXPLAIN ANALYZE,
      interleaved). Reported without a target: the check is one subquery per
      statement, which a batch of claims shares.
    """
    n, m = bench.sizes.options_workers, bench.sizes.options_items
    baseline_env = {**bench.env, "BENCH_WITHOUT_PAUSE_CHECK": "1"}
    drains: dict[str, list[float]] = {"shipped": [], "without": []}
    for repeat in range(bench.sizes.pause_check_repeats):
        order = ("shipped", "without") if repeat % 2 == 0 else ("without", "shipped")
        for variant in order:
            env = baseline_env if variant == "without" else None
            rate = drain_runworker(bench, n, m, env=env)["jobs_per_s"]
            label = "with" if variant == "shipped" else "without"
            progress(f"    runworker x{n}, {label} the pause check: {rate} jobs/s")
            drains[variant].append(rate)
    claims = 4 * bench.sizes.claim_count  # half of them each way
    result = claimers(bench, 1, 1, claims, alternate_pause_check=True)
    client = result["claim_ms_by_variant"]
    bench.reset()
    bench.enqueue_noop(5_000)
    bench.vacuum_analyze()
    server: dict[str, dict[str, list[float]]] = {
        v: {"planning_ms": [], "execution_ms": []} for v in ("shipped", "without")
    }
    for _ in range(bench.sizes.pause_check_explains):
        for variant, figures in server.items():
            plan = explain_claim(bench, 1, without_pause_check=variant == "without")
            for key, values in figures.items():
                values.append(plan[key] if plan else float("nan"))
    throughput = {v: round(statistics.median(rates), 1) for v, rates in drains.items()}
    throughput_ratio = throughput["shipped"] / throughput["without"]
    return {
        "runworker_jobs_per_s": drains,
        "runworker_jobs_per_s_median": throughput,
        "runworker_workers": n,
        "runworker_items": m,
        "throughput_ratio": round(throughput_ratio, 3),
        "claim_ms": client,
        "ratio_p50": round(client["shipped"]["p50"] / client["without"]["p50"], 3),
        "ratio_p99": round(client["shipped"]["p99"] / client["without"]["p99"], 3),
        "server_median_ms": {
            v: {k: round(statistics.median(xs), 3) for k, xs in figures.items()}
            for v, figures in server.items()
        },
        "target_min_throughput_ratio": PAUSE_CHECK_MIN_THROUGHPUT_RATIO,
        "met": throughput_ratio >= PAUSE_CHECK_MIN_THROUGHPUT_RATIO,
    }


def run(bench: Bench) -> dict[str, Any]:
    count, batch_count = bench.sizes.claim_count, bench.sizes.claim_batch_count
    runs = []
    # One claimer paced as well: what the pause alone costs a claim, with no
    # contention (the machine scenario's wake probe shows the same on SELECT 1).
    plan = [(1, 1, count, 0.0), (1, 1, count, 5.0), (4, 1, count, 0.0), (4, 1, count, 5.0)]
    if not bench.args.quick:
        plan.append((4, 32, batch_count, 0.0))
    for count_of, batch, n, think in plan:
        progress(f"  {count_of} claimer(s), batch {batch}, think {think} ms, {n} claims each")
        result = claimers(bench, count_of, batch, n, think)
        progress(f"    claim ms {result['claim_ms']}")
        runs.append(result)
    # The host decides a claim's absolute latency (its round trips and CPUs
    # shared with the claimers); what the engine decides is how much four
    # claimers at once add to one claimer's in the same run.
    alone = {r["think_ms"]: r["claim_ms"].get("p99") for r in runs if r["claimers"] == 1}
    for result in runs:
        if result["claimers"] != 4 or result["batch"] != 1:
            continue
        p99, one = result["claim_ms"].get("p99"), alone.get(result["think_ms"])
        ratio = round(p99 / one, 2) if p99 and one else None
        result["p99_ratio_to_one_claimer"] = ratio
        result["met"] = ratio is not None and ratio <= TARGETS["claim_p99_ratio_4_to_1"]
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
        "p99_ratio_4_to_1_saturated": saturated["p99_ratio_to_one_claimer"],
        "p99_ratio_4_to_1_paced": paced["p99_ratio_to_one_claimer"],
        "target_p99_ratio_4_to_1": TARGETS["claim_p99_ratio_4_to_1"],
        "met": saturated["met"] and paced["met"],
        "host_control": host_control(bench, count, saturated),
        "pause_check": pause_check_cost(bench),
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        think = f" think {run['think_ms']:g} ms" if run["think_ms"] else " flat out"
        yield Row(
            f"claim ms, {run['claimers']} claimer(s) batch {run['batch']}{think} p50/p99",
            p50_p99(run["claim_ms"]),
            absolute=True,
        )
        if "p99_ratio_to_one_claimer" in run:
            yield Row(
                f"  claim p99, 4 claimers / 1 claimer,{think}",
                run["p99_ratio_to_one_claimer"],
                f"<= {TARGETS['claim_p99_ratio_4_to_1']:g}",
                run["met"],
            )
    control = r.get("host_control")
    if control:
        yield Row(
            "  host control: the minimal table's 1-row claim, flat out, p50/p99 ms, 1 | 4",
            f"{p50_p99(control['claim_ms_1'])} | {p50_p99(control['claim_ms_4'])}",
            absolute=True,
        )
        yield Row("  host control: claim p99, 4 claimers / 1 claimer", control["p99_ratio_4_to_1"])
        yield Row(
            "  claim p99 ratio flat out / the host control's",
            control.get("engine_ratio_over_control"),
        )
    check = r.get("pause_check")
    if check:
        client, server = check["claim_ms"], check["server_median_ms"]
        rates = check["runworker_jobs_per_s_median"]
        yield Row(
            f"runworker x{check['runworker_workers']} jobs/s: as shipped / without the "
            f"pause check (median of {len(check['runworker_jobs_per_s']['shipped'])} each)",
            f"{rates['shipped']} / {rates['without']} (ratio {check['throughput_ratio']})",
            f"ratio >= {check['target_min_throughput_ratio']}",
            check["met"],
        )
        yield Row(
            "claim ms, 1 claimer alternating: as shipped / without the pause check, p50 (p99)",
            f"{client['shipped']['p50']} / {client['without']['p50']} "
            f"({client['shipped']['p99']} / {client['without']['p99']}), "
            f"ratio {check['ratio_p50']} ({check['ratio_p99']})",
        )
        yield Row(
            "  server planning + execution ms: as shipped / without",
            f"{server['shipped']['planning_ms']} + {server['shipped']['execution_ms']} / "
            f"{server['without']['planning_ms']} + {server['without']['execution_ms']}",
        )
