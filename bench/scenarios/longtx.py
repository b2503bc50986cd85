"""longtx: claim latency and throughput while a REPEATABLE READ transaction stays open.

The same two measurements run twice, without and then with a transaction
elsewhere in the database that took its snapshot (`BEGIN ISOLATION LEVEL
REPEATABLE READ; SELECT 1`) and stays open until both are done, as a long
report or a forgotten session would: 4 claimers timing `acquire_leases()`
(batch 1, as in `claim`) and M items drained by 4 `runworker --burst`
processes (as in `throughput`). While the snapshot is held, no row version
that died after it can be removed, by VACUUM or by the claim's own pruning.
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


def run(bench: Bench) -> dict[str, Any]:
    n, m, count = 4, bench.sizes.items, bench.sizes.claim_count
    runs = []
    for hold in (False, True):
        with held_snapshot(bench, hold):
            progress(f"  long transaction open: {hold}; 4 claimers x {count}, then x{n} drain")
            claim = claimers(bench, 4, 1, count)
            drain = drain_runworker(bench, n, m)
        runs.append(
            {
                "long_transaction": hold,
                "claim_ms": claim["claim_ms"],
                "throughput": {k: drain[k] for k in ("jobs_per_s", "wall_jobs_per_s", "items")},
                "client_cpu_us_per_job": drain["client_cpu_us_per_job"],
                "xact_per_job": drain["xact_per_job"],
            }
        )
    base, held = runs
    rate = held["throughput"]["jobs_per_s"] / base["throughput"]["jobs_per_s"]
    return {
        "workers": n,
        "runs": runs,
        "claim_p99_ratio": round(held["claim_ms"]["p99"] / base["claim_ms"]["p99"], 2),
        "throughput_ratio": round(rate, 3),
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        with_tx = "with a long transaction" if run["long_transaction"] else "without"
        yield Row(f"4 claimers, {with_tx}: claim p50/p99 ms", p50_p99(run["claim_ms"]))
        yield Row(
            f"runworker x{r['workers']}, {with_tx}: jobs/s (rows | wall)",
            f"{run['throughput']['jobs_per_s']} | {run['throughput']['wall_jobs_per_s']}",
        )
    yield Row(
        "long transaction: claim p99 x, throughput x (held / not held)",
        f"{r['claim_p99_ratio']}, {r['throughput_ratio']}",
    )
