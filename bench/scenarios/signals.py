"""signals: runworker's throughput with a receiver on every lease signal, and without.

The lease lifecycle signals are meant to be free when nobody listens: the
worker builds nothing for a signal without receivers. This drains the same M
items with N `runworker --burst` processes twice per repeat, alternating:
without receivers (as in `throughput`) and with a counting receiver connected
to all six signals (`bench/benchapp/receivers.py`, switched on by
BENCH_SIGNAL_RECEIVERS=1), and reports both rates and the cost of listening.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from statistics import median
from typing import Any

from bench.common import progress
from bench.context import Bench
from bench.drain import drain_runworker
from bench.report import Row

REPEATS = 2


def run(bench: Bench) -> dict[str, Any]:
    n, m = bench.sizes.options_workers, bench.sizes.options_items
    counts_dir = Path(tempfile.mkdtemp(prefix="leasing-bench-signals-"))
    listening_env = {
        **bench.env,
        "BENCH_SIGNAL_RECEIVERS": "1",
        "BENCH_SIGNAL_COUNTS": str(counts_dir),
    }
    without: list[dict[str, Any]] = []
    with_receivers: list[dict[str, Any]] = []
    for _ in range(REPEATS):
        for label, env, runs in (
            ("no receivers", None, without),
            ("a receiver on every signal", listening_env, with_receivers),
        ):
            progress(f"  runworker x{n}: {m} items, {label}")
            result = drain_runworker(bench, n, m, env=env)
            progress(f"    {result['jobs_per_s']} jobs/s")
            runs.append(result)
    received: Counter[str] = Counter()
    for path in counts_dir.glob("*.json"):
        received.update(json.loads(path.read_text()))
    rate_without = round(median(r["jobs_per_s"] for r in without), 1)
    rate_with = round(median(r["jobs_per_s"] for r in with_receivers), 1)
    return {
        "items": m,
        "workers": n,
        "repeats": REPEATS,
        "without_receivers": without,
        "with_receivers": with_receivers,
        "jobs_per_s_without": rate_without,
        "jobs_per_s_with": rate_with,
        # Summed over the listening drains: each item acquired and released once.
        "signals_received": dict(received),
        "receiver_cost": round(1 - rate_with / rate_without, 3) if rate_without else None,
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    n = r["workers"]
    yield Row(
        f"runworker x{n}, no signal receivers, jobs/s (median of {r['repeats']})",
        r["jobs_per_s_without"],
        absolute=True,
    )
    yield Row(
        f"runworker x{n}, a receiver on all 6 signals, jobs/s (median of {r['repeats']})",
        r["jobs_per_s_with"],
        absolute=True,
    )
    if r["receiver_cost"] is not None:
        yield Row("  cost of listening (1 - with / without)", f"{r['receiver_cost']:.1%}")
