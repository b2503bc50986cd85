"""longtx: claim latency and throughput while a REPEATABLE READ transaction stays open.

The same sequence runs twice, without and then with a transaction elsewhere
in the database that took its snapshot (`BEGIN ISOLATION LEVEL REPEATABLE
READ; SELECT 1`) before it and stays open until its end, as a long report or
a forgotten session would. On an emptied table: C items (default 60,000) of
churn (no-op items) drained by 4 `runworker --burst` processes, then, on
the same table, 4 claimers timing 250 `acquire_leases()` calls each (batch
1, as in `claim`) and M no-op items drained by 4 processes (as in
`throughput`). While the snapshot is held, no row version that died after it
can be removed, by VACUUM or by the claims' own pruning, so the claims meet
the churn's dead versions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from bench.common import connect, progress
from bench.context import Bench
from bench.drain import drain_runworker
from bench.report import Row, p50_p99
from bench.scenarios.claim import claimers

WORKERS = 4


@contextlib.contextmanager
def held_snapshot(bench: Bench, hold: bool) -> Iterator[None]:
    if not hold:
        yield
        return
    conn = connect(bench.url, autocommit=False)
    try:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")  # the snapshot is taken here and held until the end
        yield
    finally:
        conn.rollback()
        conn.close()


def churn(bench: Bench, items: int) -> None:
    """`items` no-op items claimed and completed by 4 runworker processes."""
    bench.enqueue_noop(items)
    procs = [bench.runworker("--burst", name=f"longtx-churn-{i}") for i in range(WORKERS)]
    bench.procs.wait_all(procs, timeout_s=max(120.0, items / 50), what="churn")
    bench.check_exit(procs, "churn")


def run(bench: Bench) -> dict[str, Any]:
    m, count, c = bench.sizes.items, bench.sizes.longtx_claim_count, bench.sizes.longtx_churn
    runs = []
    for hold in (False, True):
        bench.reset()
        bench.checkpoint()
        with held_snapshot(bench, hold):
            progress(f"  long transaction open: {hold}; churn of {c}, claims, x{WORKERS} drain")
            churn(bench, c)
            bench.enqueue_noop(WORKERS * (count + 1) + 1000)
            claim = claimers(bench, WORKERS, 1, count, fresh=False)
            bench.sql("DELETE FROM work_items WHERE status = 'pending'")  # what they left
            drain = drain_runworker(bench, WORKERS, m, fresh=False)
            dead = bench.one(
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'work_items'"
            )
        runs.append(
            {
                "long_transaction": hold,
                "claim_ms": claim["claim_ms"],
                "throughput": {k: drain[k] for k in ("jobs_per_s", "wall_jobs_per_s", "items")},
                "client_cpu_us_per_job": drain["client_cpu_us_per_job"],
                "xact_per_job": drain["xact_per_job"],
                "dead_tuples_after": dead,
            }
        )
    base, held = runs
    rate = held["throughput"]["jobs_per_s"] / base["throughput"]["jobs_per_s"]
    return {
        "workers": WORKERS,
        "churn_items": c,
        "runs": runs,
        "claim_p99_ratio": round(held["claim_ms"]["p99"] / base["claim_ms"]["p99"], 2),
        "throughput_ratio": round(rate, 3),
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        with_tx = "with a long transaction" if run["long_transaction"] else "without"
        yield Row(
            f"4 claimers after {r['churn_items']:,} churned, {with_tx}: claim p50/p99 ms",
            p50_p99(run["claim_ms"]),
            absolute=True,
        )
        yield Row(
            f"runworker x{r['workers']}, {with_tx}: jobs/s (rows | wall)",
            f"{run['throughput']['jobs_per_s']} | {run['throughput']['wall_jobs_per_s']}",
            absolute=True,
        )
    yield Row(
        "long transaction: claim p99 x, throughput x (held / not held)",
        f"{r['claim_p99_ratio']}, {r['throughput_ratio']}",
    )
