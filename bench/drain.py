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
    *,
    url: str | None = None,
    table: str = "work_items",
) -> list[subprocess.Popen[bytes]]:
    """Start n processes behind a gate and release them together; returns the processes.

    A gate transaction holds `LOCK TABLE <table> IN EXCLUSIVE MODE` (reads
    pass, writes and row locks wait) while the processes start, so each blocks
    on its first claim; once n backends of the database wait on a lock, the
    gate commits. Python and Django start-up are thus outside what is
    measured, yet the processes are the real thing. `before_release` runs
    once all of them wait, right before the gate opens.
    """
    gate = connect(url or bench.url, autocommit=False)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        gate.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
        procs = [spawn(i) for i in range(n)]

        def all_waiting() -> bool:
            for proc in procs:
                if proc.poll() is not None:  # it will never reach the gate: say why now
                    raise BenchError(
                        f"{what}: pid {proc.pid} exited {proc.returncode} before its first "
                        f"claim; log tail:\n{bench.procs.log_tail(proc, 5)}"
                    )
            return _waiting(gate) >= n

        wait_for(all_waiting, 90, f"{n} {what} processes to reach their first claim", 0.01)
        if before_release is not None:
            before_release(procs)
        gate.commit()
    finally:
        gate.close()
    return procs


def _waiting(gate: Any) -> int:
    """Backends of the gate's database that wait on a lock (other than the gate's own)."""
    # Activity is read once per transaction unless the snapshot is cleared.
    gate.execute("SELECT pg_stat_clear_snapshot()")
    return gate.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    ).fetchone()[0]


def gated_drain(
    bench: Bench,
    n: int,
    m: int,
    kind: str,
    spawn: Spawn,
    *,
    vacuum: bool = False,
    partial: bool = False,
    fresh: bool = True,
) -> dict[str, Any]:
    """Drain m no-op items with n processes that all start claiming at the same instant.

    The drain starts right after the enqueue, as a user's burst does: no VACUUM
    or ANALYZE in between unless `vacuum` (the burst scenario compares both).
    A CHECKPOINT comes first either way, so every run pays the same full-page
    writes: without it, figures swing with PostgreSQL's checkpoint cycle.
    `partial`: the processes may stop early (a time cap); the rate is then that
    of the items they completed. `fresh`: the table is emptied first; otherwise
    the m items join what it holds, and only they are counted.
    """
    since = None
    if fresh:
        bench.reset()
    else:
        since = bench.one("SELECT statement_timestamp()")
    bench.enqueue_noop(m)
    if vacuum:
        bench.vacuum_analyze()
    bench.checkpoint()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    at_gate: dict[str, Any] = {}

    def note(procs: list[subprocess.Popen[bytes]]) -> None:
        # The children's CPU so far is their start-up, outside the drain.
        at_gate["cpu"] = sum(proc_cpu_s(p.pid) for p in procs)
        at_gate["machine"] = cpu_times()
        at_gate["startup"] = time.perf_counter() - spawned
        at_gate["xact"] = bench.xact_commits()

    spawned = time.perf_counter()
    procs = gate_and_start(bench, n, kind, spawn, note)
    start = time.perf_counter()
    bench.procs.wait_all(procs, timeout_s=max(120.0, m / 50), what=kind)
    wall = time.perf_counter() - start
    cpu1, ru1 = cpu_times(), resource.getrusage(resource.RUSAGE_CHILDREN)
    bench.check_exit(procs, kind)
    stats = bench.drain_stats(since=since)
    if stats["completed"] != m and not (partial and stats["completed"]):
        raise BenchError(f"{kind} drained {stats['completed']} of {m} items")
    child_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime) - at_gate["cpu"]
    return {
        "workers": n,
        **stats,
        "wall_s": round(wall, 3),
        "wall_jobs_per_s": round(stats["completed"] / wall, 1),
        "startup_s": round(at_gate["startup"], 2),
        "vacuumed": vacuum,
        "capped": stats["completed"] < m,
        **cost_per_job(bench, stats["completed"], child_cpu, at_gate["xact"]),
        "machine_cpu_busy_pct": busy_pct(at_gate["machine"], cpu1),
    }


def cost_per_job(bench: Bench, jobs: int, client_cpu_s: float, xact_before: int) -> dict[str, Any]:
    """Client CPU microseconds and committed database transactions per job.

    The transactions are pg_stat_database's xact_commit delta of the bench
    database since `xact_before` (a backend reports its counts when it goes
    idle, at most once a second, and when it exits), so every process that
    touched the database counts, the bench's own few statements included.
    """
    time.sleep(0.2)  # exited backends report their last counts as they go
    xacts = bench.xact_commits() - xact_before
    return {
        "client_cpu_us_per_job": round(client_cpu_s * 1e6 / jobs, 1) if jobs else None,
        "xact_per_job": round(xacts / jobs, 3) if jobs else None,
    }


def drain_runworker(
    bench: Bench,
    n: int,
    m: int,
    options: tuple[str, ...] = RUNWORKER_OPTIONS,
    *,
    leasing: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    vacuum: bool = False,
    fresh: bool = True,
) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(i: int) -> subprocess.Popen[bytes]:
        proc = bench.runworker(
            "--burst", *options, name=f"drain-n{n}-{i}", env=env, leasing=leasing
        )
        procs.append(proc)
        return proc

    result = gated_drain(bench, n, m, "runworker --burst", spawn, vacuum=vacuum, fresh=fresh)
    result["completed_per_worker"] = [s.get("completed", 0) for s in bench.summaries(procs)]
    return result


def drain_ceiling(
    bench: Bench, n: int, m: int, batch: int = 1, max_seconds: float | None = None
) -> dict[str, Any]:
    """m items drained by n plain psycopg loops claiming up to `batch` rows at a time,
    each loop stopping after `max_seconds` (default: the bench's `ceiling_max_s`).

    The loops are the bar, so they run on an analyzed table: right after a bulk
    enqueue (reltuples unknown) the planner sorts every pending row per claim,
    and the single-item loop then takes minutes for 20,000 items. The time cap
    keeps `make bench` within its budget when a busy host makes every commit
    slow (the single-item loop commits twice a job): the rate is then that of
    the items the loops completed, and the record says `capped`.
    """

    def spawn(i: int) -> subprocess.Popen[bytes]:
        return bench.procs.spawn(
            [
                PYTHON,
                "-m",
                "bench.ceiling",
                bench.url,
                f"ceiling-{i}",
                "--batch",
                str(batch),
                "--max-seconds",
                str(max_seconds or bench.sizes.ceiling_max_s),
            ],
            env=bench.env,
            name=f"ceiling-k{batch}-n{n}-{i}",
        )[0]

    kind = f"plain psycopg loop, batch {batch}"
    result = gated_drain(bench, n, m, kind, spawn, vacuum=True, partial=True)
    return {"batch": batch, **result}


def fill_minimal(bench: Bench, rows: int) -> None:
    """The minimal queue table, emptied and filled with `rows` pending rows, analyzed."""
    from bench.ceiling import MINIMAL_DDL, MINIMAL_TABLE

    bench.sql(MINIMAL_DDL)
    bench.sql(f"TRUNCATE {MINIMAL_TABLE}")
    bench.sql(
        f"INSERT INTO {MINIMAL_TABLE} (created_at) "
        "SELECT statement_timestamp() + g * interval '1 microsecond' "
        "FROM generate_series(1, %s) AS g",
        [rows],
    )
    bench.vacuum_analyze(MINIMAL_TABLE)


def drain_minimal(bench: Bench, n: int, m: int, batch: int = 100) -> dict[str, Any]:
    """m rows of the minimal queue table (`bench.ceiling.MINIMAL_TABLE`) drained by n
    plain psycopg loops claiming up to `batch` rows at a time.

    Prepared as the engine-table loops are (a fresh, filled, analyzed table, a
    CHECKPOINT, the gate); the rate is on the database clock from the same
    columns: m / (last completed_at - first started_at).
    """
    from bench.ceiling import MINIMAL_TABLE

    fill_minimal(bench, m)
    bench.checkpoint()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    at_gate: dict[str, Any] = {}

    def spawn(i: int) -> subprocess.Popen[bytes]:
        return bench.procs.spawn(
            [PYTHON, "-m", "bench.ceiling", bench.url, f"minimal-{i}", "--table", "minimal",
             "--batch", str(batch), "--max-seconds", str(bench.sizes.ceiling_max_s)],
            env=bench.env,
            name=f"minimal-k{batch}-n{n}-{i}",
        )[0]  # fmt: skip

    def note(procs: list[subprocess.Popen[bytes]]) -> None:
        at_gate["cpu"] = sum(proc_cpu_s(p.pid) for p in procs)
        at_gate["xact"] = bench.xact_commits()

    kind = f"plain psycopg loop over {MINIMAL_TABLE}, batch {batch}"
    procs = gate_and_start(bench, n, kind, spawn, note, table=MINIMAL_TABLE)
    start = time.perf_counter()
    bench.procs.wait_all(procs, timeout_s=max(120.0, m / 50), what=kind)
    wall = time.perf_counter() - start
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    bench.check_exit(procs, kind)
    completed, total, span = bench.sql(
        f"SELECT count(*) FILTER (WHERE status = 'completed'), count(*), "
        f"extract(epoch FROM max(completed_at) - min(started_at)) FROM {MINIMAL_TABLE}"
    )[0]
    if not completed:
        raise BenchError(f"{kind} completed nothing of {total} rows")
    span = float(span or 0.0)
    child_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime) - at_gate["cpu"]
    return {
        "table": MINIMAL_TABLE,
        "batch": batch,
        "workers": n,
        "items": total,
        "completed": completed,
        "span_s": round(span, 3),
        "jobs_per_s": round(completed / span, 1) if span > 0 else None,
        "wall_s": round(wall, 3),
        "wall_jobs_per_s": round(completed / wall, 1),
        "capped": completed < total,
        **cost_per_job(bench, completed, child_cpu, at_gate["xact"]),
    }
