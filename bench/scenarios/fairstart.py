"""fairstart: runworker processes started one after another, as a process manager starts them.

F items (default 40,000) wait in the table; N (default 4) `runworker --burst`
processes with default settings are started back to back without a gate, so
the first may be draining before the last has imported Django. A bench-only
statement trigger (this scenario only) notes each claim statement's holder and
time, which gives every process's first claim on the database clock.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

from bench.common import BenchError, progress
from bench.context import Bench
from bench.measure import rnd
from bench.report import Row

FIRST_CLAIM_MS = 100.0

# Claims are the rows an UPDATE turns into in_progress from another status.
NOTE_CLAIMS = """
CREATE UNLOGGED TABLE bench_claims (holder text, claimed_at timestamptz, items int);
CREATE FUNCTION bench_note_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench_claims
    SELECT n.lease_holder, clock_timestamp(), count(*)
    FROM new_rows n JOIN old_rows o ON o.work_item_id = n.work_item_id
    WHERE n.status = 'in_progress' AND o.status <> 'in_progress'
    GROUP BY n.lease_holder;
    RETURN NULL;
END $$;
CREATE TRIGGER bench_note_claims AFTER UPDATE ON work_items
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION bench_note_claims();
"""
DROP_NOTE_CLAIMS = """
DROP TRIGGER IF EXISTS bench_note_claims ON work_items;
DROP FUNCTION IF EXISTS bench_note_claims();
DROP TABLE IF EXISTS bench_claims;
"""


def run(bench: Bench) -> dict[str, Any]:
    m, n = bench.sizes.fair_items, bench.sizes.fair_workers
    bench.reset()
    bench.sql(DROP_NOTE_CLAIMS)
    bench.enqueue_noop(m)
    bench.checkpoint()
    bench.sql(NOTE_CLAIMS)
    try:
        progress(f"  {n} runworker processes started one after another, {m} items")
        procs: list[subprocess.Popen[bytes]] = []
        spawned_at = []
        for i in range(n):
            spawned_at.append(bench.one("SELECT clock_timestamp()"))
            procs.append(bench.runworker("--burst", name=f"fairstart-{i}"))
        bench.procs.wait_all(procs, timeout_s=max(120.0, m / 50), what="runworker --burst")
        bench.check_exit(procs, "runworker --burst")
        summaries = bench.summaries(procs)
        if len(summaries) != n:
            raise BenchError(f"{len(summaries)} of {n} workers printed a summary")
        per_process = [
            _process(bench, i, spawned, summary, m)
            for i, (spawned, summary) in enumerate(zip(spawned_at, summaries, strict=True))
        ]
    finally:
        bench.sql(DROP_NOTE_CLAIMS)
    stats = bench.drain_stats()
    if stats["completed"] != m:
        raise BenchError(f"the workers drained {stats['completed']} of {m} items")
    waits = [p["registered_to_first_claim_ms"] for p in per_process]
    return {
        "measures": "per process: spawn -> its workers row (start-up), workers row -> its "
        "first claim statement (database clock), share of the items it completed",
        "items": m,
        "workers": n,
        "jobs_per_s": stats["jobs_per_s"],
        "processes": per_process,
        "worst_first_claim_ms": max((w for w in waits if w is not None), default=None),
        "target_first_claim_ms": FIRST_CLAIM_MS,
        "met": all(w is not None and w <= FIRST_CLAIM_MS for w in waits),
    }


def _process(
    bench: Bench, index: int, spawned: Any, summary: dict[str, Any], items: int
) -> dict[str, Any]:
    worker_id = summary["worker_id"]
    registered, first_claim, claims = bench.sql(
        """
        SELECT w.started_at, min(c.claimed_at), count(c.*)
        FROM workers w LEFT JOIN bench_claims c ON c.holder = w.worker_id
        WHERE w.worker_id = %s GROUP BY w.started_at
        """,
        [worker_id],
    )[0]
    return {
        "index": index,
        "worker_id": worker_id,
        "spawn_to_registered_s": rnd((registered - spawned).total_seconds(), 3),
        "registered_to_first_claim_ms": (
            rnd((first_claim - registered).total_seconds() * 1000) if first_claim else None
        ),
        "claim_statements": claims,
        "completed": summary.get("completed", 0),
        "share": round(summary.get("completed", 0) / items, 3),
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    yield Row(f"fair start x{r['workers']}, {r['items']:,} items: jobs/s (rows)", r["jobs_per_s"])
    for p in r["processes"]:
        wait = p["registered_to_first_claim_ms"]
        yield Row(
            f"  process {p['index'] + 1}: start-up s, first claim ms, share",
            f"{p['spawn_to_registered_s']}, {wait if wait is not None else 'never'}, "
            f"{p['share']:.1%}",
            f"claim <= {FIRST_CLAIM_MS:g} ms",
            wait is not None and wait <= FIRST_CLAIM_MS,
            absolute=True,
        )
