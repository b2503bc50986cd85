"""Claim latency with 100,000 items blocked by dependencies, against none (PostgreSQL).

    .venv/bin/python -m bench.blocked                      # 100,000 blocked vs none
    .venv/bin/python -m bench.blocked --blocked 20000 --claims 1000
    .venv/bin/python -m bench.blocked --baseline-root /tmp/leasing-main   # + code without them

Each scenario gets a fresh database (`--database`, default
`leasing_bench_blocked`, on the server of $DATABASE_URL) migrated by the code
it measures, `--claimable` no-op items (priority 0) and, in the blocked
scenario, `--blocked` items that depend on an item that never runs (priority
10: ahead of every claimable item in claim order, were they claimable). After
VACUUM ANALYZE, one process times `--claims` calls of
`LeaseManager.acquire_leases(1, 300, work_type_filter=["bench.noop"])` (the
call `runworker` makes), completing each claimed item untimed as a worker
does; 100 warm-up claims are not timed. It also records EXPLAIN (ANALYZE,
BUFFERS) of the claim statement: the blocked items are not in the claim index,
so the claim reads as many index pages with 100,000 of them as with none.

`--baseline-root` also measures the no-blocked scenario with the code of
another checkout (for instance `git archive main | tar -x -C DIR`), to show
that the plain claim path is no slower than before dependencies existed. The
scenarios run in turn, `--rounds` times, so machine noise hits them alike.
One JSON line per scenario and round on stdout, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    DEFAULT_SERVER_URL,
    drop_database,
    emit,
    progress,
    recreate_database,
    summary_ms,
    with_database,
)


def measure(claimable: int, blocked: int, claims: int) -> dict[str, Any]:
    """In a subprocess whose code (PYTHONPATH) is the code measured."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from leasing import LeaseManager, enqueue, enqueue_many
    from leasing.services.completion import complete

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    if blocked:
        far = django.utils.timezone.now() + django.utils.timezone.timedelta(days=365)
        blocker = enqueue("blocker", "bench.noop", run_after=far)
        for start in range(0, blocked, 10_000):
            enqueue_many(
                [
                    {
                        "task_id": f"blocked-{i}",
                        "work_type": "bench.noop",
                        "priority": 10,
                        "depends_on": [blocker.work_item_id],
                    }
                    for i in range(start, min(blocked, start + 10_000))
                ]
            )
    enqueue_many([{"task_id": f"c-{i}", "work_type": "bench.noop"} for i in range(claimable)])
    setup_s = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE work_items")
    manager = LeaseManager("bench-blocked")

    def claim() -> tuple[float, int]:
        t0 = time.perf_counter_ns()
        leases = manager.acquire_leases(1, 300, work_type_filter=["bench.noop"])
        t1 = time.perf_counter_ns()
        complete(manager, [(lease, None) for lease in leases])
        return (t1 - t0) / 1e6, len(leases)

    for _ in range(100):
        claim()
    durations = []
    for _ in range(claims):
        ms, got = claim()
        assert got == 1, "ran out of claimable items: raise --claimable"
        durations.append(ms)
    plan = _explain(connection, transaction, manager)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FROM work_items"
        )
        pending, total = cursor.fetchone()
    return {
        "claim_ms": summary_ms(durations, 3),
        "explain": plan,
        "pending_rows": pending,
        "rows": total,
        "setup_s": round(setup_s, 1),
    }


def _explain(connection: Any, transaction: Any, manager: Any) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of one claim, rolled back."""
    from leasing.services.terms import claim_terms
    from leasing.sql.limits import Limits
    from leasing.sql.terms import ClaimFilters
    from leasing.storage import storage_for

    statement, params = storage_for().claim(
        manager.worker_id, 1, claim_terms(300), ClaimFilters(work_types=("bench.noop",)), Limits()
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", params)
        document = cursor.fetchone()[0]
        if isinstance(document, str):
            document = json.loads(document)
        transaction.set_rollback(True)
    top = document[0]
    nodes, stack = [], [top["Plan"]]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.get("Plans", []))
    scans = [
        n for n in nodes if "Scan" in n["Node Type"] and n.get("Relation Name") == "work_items"
    ]
    return {
        "execution_ms": round(top["Execution Time"], 3),
        "scans": [
            {
                "node": n["Node Type"],
                "index": n.get("Index Name"),
                "rows": n.get("Actual Rows"),
                "removed_by_filter": n.get("Rows Removed by Filter", 0),
                "shared_hit": n.get("Shared Hit Blocks", 0),
            }
            for n in scans
        ],
    }


def run_scenario(
    args: argparse.Namespace, label: str, root: Path, blocked: int, round_no: int
) -> dict[str, Any]:
    recreate_database(args.database_url, args.database)
    env = dict(os.environ)
    env.update(
        DATABASE_URL=with_database(args.database_url, args.database),
        DJANGO_SETTINGS_MODULE="bench.settings",
        LEASING_LOG_LEVEL="WARNING",
        PYTHONPATH=str(root),
    )
    command = [
        sys.executable,
        str(HERE),
        "measure",
        str(args.claimable),
        str(blocked),
        str(args.claims),
    ]
    progress(f"{label}: round {round_no}, {blocked:,} blocked, {args.claims:,} claims")
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{label} failed:\n{done.stderr[-3000:]}")
    record = {"scenario": label, "round": round_no, "blocked": blocked}
    record.update(json.loads(done.stdout.strip().splitlines()[-1]))
    emit(record)
    return record


def main(argv: list[str] | None = None) -> int:
    if argv and argv[0] == "measure":
        claimable, blocked, claims = (int(x) for x in argv[1:4])
        print(json.dumps(measure(claimable, blocked, claims)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_SERVER_URL)
    )
    parser.add_argument("--database", default="leasing_bench_blocked")
    parser.add_argument("--blocked", type=int, default=100_000)
    parser.add_argument("--claimable", type=int, default=5_000)
    parser.add_argument("--claims", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-root", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.claims + 100 > args.claimable:
        parser.error("--claimable must exceed --claims by the 100 warm-up claims")

    plan = [("no blocked items", ROOT, 0), (f"{args.blocked:,} blocked", ROOT, args.blocked)]
    if args.baseline_root is not None:
        plan.insert(0, ("baseline code, no blocked items", args.baseline_root.resolve(), 0))
    records = []
    try:
        for round_no in range(1, args.rounds + 1):
            for label, root, blocked in plan:
                records.append(run_scenario(args, label, root, blocked, round_no))
    finally:
        drop_database(args.database_url, args.database)
    print()
    print(
        f"{'scenario':34} {'round':>5} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
        f"{'claim exec ms':>13} {'index hits':>10}"
    )
    for r in records:
        c, e = r["claim_ms"], r["explain"]
        hits = sum(s["shared_hit"] for s in e["scans"])
        print(
            f"{r['scenario']:34} {r['round']:>5} {c['p50']:>8} {c['p90']:>8} {c['p99']:>8} "
            f"{e['execution_ms']:>13} {hits:>10}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
