"""longrun: L concurrent items of S seconds each (default 5,000 x 5 s) over 4 processes.

Each `runworker --burst --concurrency L/4` process (HEARTBEAT_INTERVAL 1) runs
L/4 `bench.wait` items at once (one `time.sleep(S)` each), so the ideal wall
time is S. The interval is 1 s so that leases are renewed during a 5 s item
(the default, 30 s, would renew nothing); the lease stays the default.
Measured: wall time from the gate's release to the last completion (database
clock), the most database connections each process had open at once (each
runs with its own PGAPPNAME) and how many of them LISTEN, its largest RSS, and
the renewals: work_items updates beyond each item's claim and completion
(pg_stat_user_tables) per second, and the HOT share of those.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterator
from typing import Any

from bench.common import BenchError, progress
from bench.context import Bench
from bench.drain import gate_and_start
from bench.report import Row
from bench.sampler import Sampler
from bench.scenarios.heartbeat import hot_counters

WALL_RATIO = 1.2
CONNECTIONS_PER_PROCESS = 2  # plus the LISTEN connection


def run(bench: Bench) -> dict[str, Any]:
    from leasing import enqueue_many

    items, seconds, n = (
        bench.sizes.longrun_items,
        bench.sizes.longrun_seconds,
        bench.sizes.longrun_workers,
    )
    per_process = math.ceil(items / n)
    bench.reset()
    enqueue_many(
        [
            {"task_id": f"long-{i}", "work_type": "bench.wait", "input_data": {"seconds": seconds}}
            for i in range(items)
        ]
    )
    bench.checkpoint()
    names = [f"bench-longrun-{i}" for i in range(n)]
    procs: list[subprocess.Popen[bytes]] = []
    state: dict[str, Any] = {}

    def spawn(i: int) -> subprocess.Popen[bytes]:
        proc = bench.runworker(
            "--burst", "--work-type", "bench.wait", "--concurrency", str(per_process),
            name=f"longrun-{i}", env={**bench.env, "PGAPPNAME": names[i]},
            leasing={"HEARTBEAT_INTERVAL": 1},
        )  # fmt: skip
        procs.append(proc)
        return proc

    def release(started: list[subprocess.Popen[bytes]]) -> None:
        state["sampler"] = Sampler(bench.url, {names[i]: p.pid for i, p in enumerate(started)})
        state["sampler"].__enter__()
        state["counters"] = hot_counters(bench)
        state["released_at"] = bench.one("SELECT clock_timestamp()")

    progress(f"  {items} items of {seconds:g} s over {n} processes x {per_process} threads")
    try:
        gate_and_start(bench, n, "runworker --burst", spawn, release)
        bench.procs.wait_all(procs, timeout_s=max(120.0, 20 * seconds), what="runworker --burst")
    finally:
        if "sampler" in state:
            state["sampler"].__exit__()
    bench.check_exit(procs, "runworker --burst")
    sampler: Sampler = state["sampler"]
    if sampler.error is not None:
        raise BenchError(f"the sampler failed: {sampler.error}")
    upd1, hot1 = hot_counters(bench)
    completed, last, reclaimed = bench.sql(
        "SELECT count(*) FILTER (WHERE status = 'completed'), max(completed_at), "
        "count(*) FILTER (WHERE lease_token <> 1) FROM work_items"
    )[0]
    if completed != items:
        raise BenchError(f"{completed} of {items} long items completed")
    wall = (last - state["released_at"]).total_seconds()
    upd0, hot0 = state["counters"]
    renewals = (upd1 - upd0) - 2 * items
    return {
        "items": items,
        "item_seconds": seconds,
        "workers": n,
        "concurrency": per_process,
        "claimed_more_than_once": reclaimed,
        "wall_s": round(wall, 3),
        "ideal_s": seconds,
        "wall_to_ideal": round(wall / seconds, 3),
        "wall_met": wall / seconds <= WALL_RATIO,
        "connections": [sampler.connections.get(name, 0) for name in names],
        "listeners": [sampler.listeners.get(name, 0) for name in names],
        "connections_met": all(
            sampler.connections.get(name, 0)
            <= CONNECTIONS_PER_PROCESS + sampler.listeners.get(name, 0)
            for name in names
        ),
        "rss_mib": [sampler.rss.get(name) for name in names],
        "renewals": renewals,
        "renewals_per_s": round(renewals / wall, 1) if wall > 0 else None,
        "renewal_hot_share": round((hot1 - hot0) / renewals, 3) if renewals > 0 else None,
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    yield Row(
        f"long items: {r['items']:,} x {r['item_seconds']:g} s over {r['workers']} processes, "
        "wall s / ideal",
        f"{r['wall_s']} / {r['ideal_s']:g} ({r['wall_to_ideal']}x)",
        f"<= {WALL_RATIO}x",
        r["wall_met"],
        absolute=True,
    )
    yield Row(
        "  database connections per process (of them LISTEN)",
        ", ".join(f"{c} ({li})" for c, li in zip(r["connections"], r["listeners"], strict=True)),
        f"<= {CONNECTIONS_PER_PROCESS} + listener",
        r["connections_met"],
    )
    yield Row("  RSS MiB per process", ", ".join(str(x) for x in r["rss_mib"]))
    yield Row("  renewals/s, HOT share", f"{r['renewals_per_s']}, {r['renewal_hot_share']}")
