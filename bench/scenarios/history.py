"""history: claim latency and a sweep of 1,000 at 1,000,000 rows, then at 10,000,000.

The 1,000,000 rows are the `sweep` scenario's (2% pending, 0.1% live leases,
1% failed, the rest completed); then completed history is added until the
table holds H rows (default 10,000,000: the same live part, the rest finished
work), as a table that keeps years of history does. At each size, after
VACUUM ANALYZE (autovacuum would have run on such a table): 4 concurrent
claimers timing `acquire_leases()` on the table's own pending items (as in
`claim`), and the first recovery pass over 1,000 expired leases in a fresh
process (as in `sweep`: the median of 3 such passes). Not part of `make bench`
(loading takes minutes): `make bench-history`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from bench.common import progress
from bench.context import Bench
from bench.report import Row, median_of, p50_p99
from bench.scenarios.claim import claimers
from bench.scenarios.sweep import load_rows, sweep_once

RATIO = 1.5
EXPIRED = 1_000


def add_history(bench: Bench, first: int, count: int) -> float:
    """`count` completed items with ids after `first`, in batches of 1,000,000."""
    start = time.perf_counter()
    for lo in range(first + 1, first + count + 1, 1_000_000):
        hi = min(lo + 999_999, first + count)
        bench.sql(
            """
            INSERT INTO work_items (
                work_item_id, task_id, work_type, status, priority, lease_token, retry_count,
                max_retries, queue_name, input_data, created_at, started_at, completed_at,
                updated_at)
            SELECT lpad(g::text, 26, '0'), 'task-' || g, 'bench.noop', 'completed', 0, 1, 0, 3,
                   'default', '{"n": 1}'::jsonb,
                   now() - interval '400 days' + g * interval '1 ms',
                   now() - interval '400 days' + g * interval '1 ms',
                   now() - interval '400 days' + g * interval '1 ms', now()
            FROM generate_series(%s::bigint, %s::bigint) AS g
            """,
            [lo, hi],
        )
        progress(f"    {hi - first:,} of {count:,} history rows")
    return time.perf_counter() - start


def measure(bench: Bench, rows_total: int, expired: int) -> dict[str, Any]:
    bench.vacuum_analyze()
    count = bench.sizes.claim_count
    progress(f"  at {rows_total:,} rows: 4 claimers x {count}")
    claim = claimers(bench, 4, 1, count, fresh=False)
    progress(f"    claim ms {claim['claim_ms']}")
    sweep = sweep_once(bench, expired, rows_total=rows_total)
    return {
        "rows": rows_total,
        "claim_ms": claim["claim_ms"],
        "claim_explain_ms": claim["server_explain_ms_fresh_backlog"],
        "sweep_expired": sweep["expired"],
        "sweep_ms": sweep["wall_ms"],
        "sweep_ms_runs": sweep.get("wall_ms_runs"),
        "table_mib": round(bench.one("SELECT pg_total_relation_size('work_items')") / 2**20),
    }


def run(bench: Bench) -> dict[str, Any]:
    # Loading and vacuuming 10,000,000 rows outlasts the bench's usual 300 s.
    bench.sql("SET statement_timeout = '1800s'")
    try:
        return _run(bench)
    finally:
        bench.sql("SET statement_timeout = '300s'")


def _run(bench: Bench) -> dict[str, Any]:
    base, big = bench.sizes.sweep_rows, bench.sizes.history_rows
    progress(f"  loading {base:,} rows")
    load_rows(bench, base)
    expired = min(EXPIRED, base // 100)  # the same sweep at both sizes
    small = measure(bench, base, expired)
    progress(f"  adding {big - base:,} completed rows")
    load_s = add_history(bench, base, big - base)
    large = measure(bench, big, expired)
    claim_ratio = large["claim_ms"]["p99"] / small["claim_ms"]["p99"]
    sweep_ratio = large["sweep_ms"] / small["sweep_ms"]
    return {
        "measures": (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "runs": [small, large],
        "history_load_s": round(load_s, 1),
        "claim_p99_ratio": round(claim_ratio, 2),
        "sweep_ratio": round(sweep_ratio, 2),
        "target_ratio": RATIO,
        "claim_met": claim_ratio <= RATIO,
        "sweep_met": sweep_ratio <= RATIO,
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    for run in r["runs"]:
        yield Row(
            f"history {run['rows']:,} rows ({run['table_mib']:,} MiB): 4 claimers p50/p99 ms",
            p50_p99(run["claim_ms"]),
            absolute=True,
        )
        yield Row(
            f"  sweep of {run['sweep_expired']:,} expired among {run['rows']:,}",
            f"{run['sweep_ms']} ms{median_of(run.get('sweep_ms_runs'))}",
            absolute=True,
        )
    big, small = r["runs"][1]["rows"], r["runs"][0]["rows"]
    yield Row(
        f"claim p99 at {big:,} / at {small:,} rows",
        r["claim_p99_ratio"],
        f"<= {RATIO}",
        r["claim_met"],
    )
    yield Row(
        f"sweep of {r['runs'][0]['sweep_expired']:,} at {big:,} / at {small:,} rows",
        r["sweep_ratio"],
        f"<= {RATIO}",
        r["sweep_met"],
    )
