"""Gated drains: N real processes start claiming at one instant and drain M no-op items."""

from __future__ import annotations

import resource
import subprocess
import time
from collections.abc import Callable
from typing import Any

from bench.common import PYTHON, BenchError, connect, wait_for
from bench.config import RUNWORKER_OPTIONS
from bench.context import Bench
from bench.measure import busy_pct, cpu_times, proc_cpu_s

Spawn = Callable[[int], subprocess.Popen[bytes]]


def gate_and_start(
    bench: Bench,
    n: int,
    what: str,
    spawn: Spawn,
    before_release: Callable[[list[subprocess.Popen[bytes]]], None] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start n processes behind a gate and release them together; returns the processes.

    A gate transaction holds `LOCK TABLE work_items IN EXCLUSIVE MODE` (reads
    pass, writes wait) while the processes start, so each blocks on its first
    claim; once all n wait on the lock, the gate commits. Python and Django
    start-up are thus outside what is measured, yet the processes are the real thing.
    `before_release` runs once all of them wait, right before the gate opens.
    """
    gate = connect(bench.url, autocommit=False)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        gate.execute("LOCK TABLE work_items IN EXCLUSIVE MODE")
        procs = [spawn(i) for i in range(n)]
        wait_for(
            lambda: all(p.poll() is None for p in procs) and bench.blocked_on_gate() >= n,
            90,
            f"{n} {what} processes to reach their first claim",
            interval_s=0.01,
        )
        if before_release is not None:
            before_release(procs)
        gate.commit()
    finally:
        gate.close()
    return procs


def gated_drain(bench: Bench, n: int, m: int, kind: str, spawn: Spawn) -> dict[str, Any]:
    """Drain m no-op items with n processes that all start claiming at the same instant."""
    bench.reset()
    bench.enqueue_noop(m)
    bench.vacuum_analyze()
    bench.checkpoint()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    at_gate: dict[str, Any] = {}

    def note(procs: list[subprocess.Popen[bytes]]) -> None:
        # The children's CPU so far is their start-up, outside the drain.
        at_gate["cpu"] = sum(proc_cpu_s(p.pid) for p in procs)
        at_gate["machine"] = cpu_times()
        at_gate["startup"] = time.perf_counter() - spawned

    spawned = time.perf_counter()
    procs = gate_and_start(bench, n, kind, spawn, note)
    start = time.perf_counter()
    bench.procs.wait_all(procs, timeout_s=max(120.0, m / 50), what=kind)
    wall = time.perf_counter() - start
    cpu1, ru1 = cpu_times(), resource.getrusage(resource.RUSAGE_CHILDREN)
    bench.check_exit(procs, kind)
    stats = bench.drain_stats()
    if stats["completed"] != m:
        raise BenchError(f"{kind} drained {stats['completed']} of {m} items")
    child_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime) - at_gate["cpu"]
    return {
        "workers": n,
        **stats,
        "wall_s": round(wall, 3),
        "wall_jobs_per_s": round(m / wall, 1),
        "startup_s": round(at_gate["startup"], 2),
        "client_cpu_ms_per_job": round(child_cpu * 1000 / m, 3),
        "machine_cpu_busy_pct": busy_pct(at_gate["machine"], cpu1),
    }


def drain_runworker(
    bench: Bench, n: int, m: int, options: tuple[str, ...] = RUNWORKER_OPTIONS
) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(i: int) -> subprocess.Popen[bytes]:
        proc = bench.runworker("--burst", "--json", *options, name=f"drain-n{n}-{i}")
        procs.append(proc)
        return proc

    result = gated_drain(bench, n, m, "runworker --burst", spawn)
    result["completed_per_worker"] = [s.get("completed", 0) for s in bench.summaries(procs)]
    return result


def drain_ceiling(bench: Bench, n: int, m: int) -> dict[str, Any]:
    def spawn(i: int) -> subprocess.Popen[bytes]:
        return bench.procs.spawn(
            [PYTHON, "-m", "bench.ceiling", bench.url, f"ceiling-{i}"],
            env=bench.env,
            name=f"ceiling-n{n}-{i}",
        )[0]

    return gated_drain(bench, n, m, "plain psycopg loop", spawn)
