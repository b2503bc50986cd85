"""machine: nproc, CPU, PostgreSQL version and settings, versions, git commit (always printed)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common import ROOT, connect, progress, summary_ms
from bench.config import RUNWORKER_OPTIONS
from bench.context import Bench
from bench.drain import drain_ceiling
from bench.report import Row


def run(bench: Bench) -> dict[str, Any]:
    import django
    import psycopg

    settings = dict(
        bench.sql(
            """
            SELECT name, setting || COALESCE(unit, '') FROM pg_settings
            WHERE name IN ('synchronous_commit', 'fsync', 'shared_buffers', 'max_connections',
                           'wal_level', 'full_page_writes', 'autovacuum',
                           'shared_preload_libraries', 'work_mem', 'commit_delay')
            """
        )
    )
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = ""
    with contextlib.suppress(Exception):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "postgresql": bench.one("SHOW server_version"),
        "pg_settings": settings,
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "git_commit": commit,
        "quick": bool(bench.args.quick),
        "sizes": asdict(bench.sizes),
        "runworker_options": list(RUNWORKER_OPTIONS),
        "raw_loop_probe": raw_loop_probe(bench),
        "commit_probe": commit_probe(bench),
        "wake_probe": wake_probe(bench),
    }


COMMIT_PROBES = 1_000
COMMIT_PROBE_GAP_S = 0.005


def commit_probe(bench: Bench) -> dict[str, Any]:
    """How long this host's server takes to commit one row, idle: a commit
    returns once its WAL reached the disk (synchronous_commit), and no worker
    sees an enqueued item before its commit returns, so the tail of this
    figure is a floor under every enqueue->start latency of the run."""
    progress(f"  commit probe: {COMMIT_PROBES} one-row commits")
    with connect(bench.url) as conn:
        conn.execute("CREATE TABLE bench_commit_probe (x int)")
        try:
            statement = "INSERT INTO bench_commit_probe VALUES (1)"
            return summary_ms(_timed(conn, statement, COMMIT_PROBES, COMMIT_PROBE_GAP_S))
        finally:
            conn.execute("DROP TABLE bench_commit_probe")


def _timed(conn: Any, statement: str, count: int, gap_s: float) -> list[float]:
    """Milliseconds of `count` executions of `statement`, `gap_s` of sleep after each."""
    ms: list[float] = []
    for _ in range(count):
        started = time.perf_counter()
        conn.execute(statement)
        ms.append((time.perf_counter() - started) * 1000)
        if gap_s:
            time.sleep(gap_s)
    return ms


WAKE_PROBE_GAP_S = 0.005


def wake_probe(bench: Bench) -> dict[str, Any]:
    """What an idle pause costs this host's next round trip: `SELECT 1` back to
    back, then each after a 5 ms sleep (as the claim scenario's paced claimers
    and a handler of 5 ms pause). On this VM a CPU left idle for a few
    milliseconds comes back slow (caches and the idle vCPU): the paced figure
    is the host's floor under every claim made after a pause, with no
    contention at all."""
    count = bench.sizes.wake_probes
    progress(f"  wake probe: {count} round trips back to back, then 5 ms apart")
    with connect(bench.url) as conn:
        return {
            name: summary_ms(_timed(conn, "SELECT 1", count, gap), 3)
            for name, gap in (("back_to_back", 0.0), ("after_5ms_idle", WAKE_PROBE_GAP_S))
        }


def raw_loop_probe(bench: Bench) -> dict[str, Any]:
    """How fast this host is now: the single-item psycopg loop (`bench.ceiling`,
    K = 1) at 4 processes over a few thousand items. Every absolute figure of
    the table is printed beside it (the `ceiling` scenario's 20,000-item figure
    when that ran), so a figure from a slow phase of a shared host reads as such."""
    n, m = bench.sizes.probe_workers, bench.sizes.probe_items
    progress(f"  raw loop probe: {m} items, {n} processes")
    run = drain_ceiling(bench, n, m, 1, max_seconds=10.0)
    return {"workers": n, "items": m, "jobs_per_s": run["jobs_per_s"]}


def raw_loop(results: dict[str, dict[str, Any]]) -> float | None:
    """The same run's single-item loop at 4 processes: `ceiling`'s, else the probe's."""
    for r in results.get("ceiling", {}).get("runs", []):
        if r["batch"] == 1 and r["workers"] == 4:
            return r["jobs_per_s"]
    return results.get("machine", {}).get("raw_loop_probe", {}).get("jobs_per_s")


def rows(m: dict[str, Any]) -> Iterator[Row]:
    pg = m.get("pg_settings", {})
    yield Row(
        "machine",
        f"{m.get('nproc')} CPU, PostgreSQL {m.get('postgresql')}, "
        f"synchronous_commit={pg.get('synchronous_commit')}, fsync={pg.get('fsync')}",
    )
    probe = m.get("raw_loop_probe") or {}
    yield Row(
        f"raw loop probe x{probe.get('workers')}, {probe.get('items', 0):,} items, jobs/s",
        probe.get("jobs_per_s"),
    )
    commit = m.get("commit_probe") or {}
    yield Row(
        f"one-row commit, idle server ({commit.get('n')}): p50 / p99 / max ms",
        f"{commit.get('p50')} / {commit.get('p99')} / {commit.get('max')}",
    )
    wake = m.get("wake_probe") or {}
    if wake:
        busy, idle = wake["back_to_back"], wake["after_5ms_idle"]
        yield Row(
            "SELECT 1 round trip ms p50 / p99: back to back; after a 5 ms idle",
            f"{busy.get('p50')} / {busy.get('p99')}; {idle.get('p50')} / {idle.get('p99')}",
        )
