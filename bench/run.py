"""The benchmark suite of the leasing app (GitHub issue 6): `make bench`.

    .venv/bin/python -m bench.run                       # the full run (< 10 minutes)
    .venv/bin/python -m bench.run --quick               # a smoke run (< 1 minute)
    .venv/bin/python -m bench.run --only throughput,ceiling --workers 1,4 --items 50000

It (re)creates its own PostgreSQL database (`--database`, default
`leasing_bench`) on the server of `--database-url` (default: $DATABASE_URL or
postgres://postgres@127.0.0.1:5432/test), migrates it, runs each scenario and
prints one JSON line per scenario on stdout (every line that starts with `{`),
then a readable table. Progress goes to stderr. Subprocesses log to a
temporary directory, kept (and named) when something fails. The database is
dropped at the end unless `--keep`; subprocesses are stopped on exit, failure
and SIGINT/SIGTERM. Drains start behind a gate (a LOCK TABLE held until every
process waits on its first claim) right after VACUUM ANALYZE + CHECKPOINT, so
start-up and checkpoint timing stay out of the figures.

The throughput scenario runs `runworker --burst --json` with RUNWORKER_OPTIONS
(`--work-type bench.noop --concurrency 1`: default prefetch, which adapts to
how fast the handler is; the `options` scenario compares other settings).

Scenarios (see BENCHMARKS.md for the details):

  machine     nproc, CPU, PostgreSQL version and settings (always printed)
  enqueue     enqueue_many() of 100,000 items, in-process
  throughput  M no-op items drained by N real `runworker --burst` processes
  ceiling     the same drained by N plain psycopg claim/complete loops; ratio
  options     runworker --concurrency/--prefetch combinations at 4 processes
  claim       acquire_leases() latency with concurrent claimers, + EXPLAIN ANALYZE
  pickup      enqueue -> started_at with idle runworker processes (LISTEN/NOTIFY)
  recovery    SIGKILLed worker: kill -> re-claimed by another worker
  sweep       scan_and_recover() with 1,000 / 100,000 expired among 1,000,000 rows
  heartbeat   renew_leases() of 1,000 leases: renewals/s and HOT-update share
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    DEFAULT_SERVER_URL,
    PYTHON,
    ROOT,
    BenchError,
    Processes,
    drop_database,
    emit,
    install_cleanup,
    make_log_dir,
    progress,
    recreate_database,
    subprocess_env,
    summary_ms,
    wait_for,
    with_database,
)

SCENARIOS = (
    "enqueue",
    "throughput",
    "ceiling",
    "options",
    "claim",
    "pickup",
    "recovery",
    "sweep",
    "heartbeat",
)

# How the throughput scenario runs runworker: each process serves only the
# bench work type with one handler thread (a no-op handler gains nothing from
# more threads) and the default, adaptive prefetch (about 0.1 s of work claimed
# ahead while handlers are fast). The `options` scenario compares the rest.
RUNWORKER_OPTIONS: tuple[str, ...] = (
    "--work-type",
    "bench.noop",
    "--concurrency",
    "1",
)

# The runworker option sets the `options` scenario compares (4 processes).
OPTION_GRID: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (label, ("--work-type", "bench.noop", *options) if typed else options)
    for label, typed, options in (
        ("c1 prefetch=adaptive", True, ("--concurrency", "1")),
        ("c1 prefetch=0", True, ("--concurrency", "1", "--prefetch", "0")),
        ("c1 prefetch=32", True, ("--concurrency", "1", "--prefetch", "32")),
        ("c1 prefetch=128", True, ("--concurrency", "1", "--prefetch", "128")),
        ("c4 prefetch=adaptive", True, ("--concurrency", "4")),
        ("c4 prefetch=32", True, ("--concurrency", "4", "--prefetch", "32")),
        ("all work types, c1 prefetch=adaptive", False, ("--concurrency", "1")),
    )
)

TARGETS = {
    "ratio_n4": 1.0,
    "ratio_n1": 0.8,
    "claim_p99_ms": 5.0,
    "pickup_p50_ms": 20.0,
    "enqueue_100k_s": 5.0,
    "sweep_1k_ms": 50.0,
    "sweep_100k_s": 10.0,
    "recovery_slack_s": 1.0,
}


@dataclass
class Sizes:
    items: int = 20_000
    workers: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    enqueue_items: int = 100_000
    options_items: int = 10_000
    options_workers: int = 4
    options_repeats: int = 2
    claim_count: int = 1_000  # claims per claimer process
    claim_batch_count: int = 100  # claims of 32 per claimer process
    pickup_items: int = 200
    pickup_workers: list[int] = field(default_factory=lambda: [1, 4])
    pickup_gap_ms: tuple[float, float] = (20.0, 50.0)
    recovery_items: int = 20
    recovery_rounds: int = 3
    recovery_lease_s: float = 2.0
    recovery_heartbeat_s: float = 0.5
    recovery_sweep_interval_s: float = 0.5
    sweep_rows: int = 1_000_000
    sweep_expired: list[int] = field(default_factory=lambda: [1_000, 100_000])
    heartbeat_leases: int = 1_000
    heartbeat_seconds: float = 3.0

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            items=500,
            workers=[1, 2],
            enqueue_items=5_000,
            options_items=300,
            options_workers=2,
            options_repeats=1,
            claim_count=100,
            claim_batch_count=5,
            pickup_items=20,
            pickup_workers=[1],
            recovery_items=5,
            recovery_rounds=1,
            sweep_rows=20_000,
            sweep_expired=[100, 2_000],
            heartbeat_leases=200,
            heartbeat_seconds=0.5,
        )


# --- the benchmark context -------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sizes: Sizes = Sizes.quick() if args.quick else Sizes()
        if args.items is not None:
            self.sizes.items = args.items
        if args.workers is not None:
            self.sizes.workers = args.workers
        self.server_url: str = args.database_url
        self.db_name: str = args.database
        self.url = with_database(self.server_url, self.db_name)
        self.log_dir = make_log_dir()
        self.procs = Processes(self.log_dir)
        self.results: dict[str, dict[str, Any]] = {}
        self.failed: list[str] = []
        self.env = subprocess_env(self.url)
        self._torn_down = False

    # --- setup and teardown -------------------------------------------------------------------

    def setup(self) -> None:
        progress(f"creating database {self.db_name} on {self.server_url}")
        recreate_database(self.server_url, self.db_name)
        os.environ.update(
            DATABASE_URL=self.url,
            DJANGO_SETTINGS_MODULE="bench.settings",
            LEASING_LOG_LEVEL="WARNING",
            CONN_MAX_AGE="600",
        )
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.management import call_command

        progress("migrating")
        call_command("migrate", verbosity=0, interactive=False)
        self.sql("SET statement_timeout = '300s'")

    def teardown(self) -> None:
        if self._torn_down:
            return
        self._torn_down = True
        self.procs.cleanup()
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if self.args.keep:
            progress(f"kept database {self.db_name}")
            return
        try:
            drop_database(self.server_url, self.db_name)
        except BaseException as exc:  # never hide the run's own outcome
            progress(f"could not drop database {self.db_name}: {exc}")

    # --- SQL in the bench process (Django's connection) ---------------------------------------

    def sql(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def one(self, query: str, params: Any = ()) -> Any:
        rows = self.sql(query, params)
        return rows[0][0] if rows else None

    def reset(self) -> None:
        """Empty every leasing table (and the django-q2 ones stay untouched)."""
        self.sql("TRUNCATE work_items, checkpoints, idempotency_keys, workers CASCADE")

    def checkpoint(self) -> None:
        """Start a measurement right after a checkpoint, so every run pays the same
        full-page writes: without it, figures swing with where PostgreSQL's
        checkpoint cycle happens to be."""
        self.sql("CHECKPOINT")

    def vacuum_analyze(self, table: str = "work_items") -> None:
        self.sql(f"VACUUM (ANALYZE) {table}")

    def enqueue_noop(self, count: int, work_type: str = "bench.noop") -> float:
        from leasing import enqueue_many

        specs = [{"task_id": f"task-{i}", "work_type": work_type} for i in range(count)]
        start = time.perf_counter()
        for chunk in range(0, count, 100_000):
            enqueue_many(specs[chunk : chunk + 100_000])
        return time.perf_counter() - start

    def runworker(self, *options: str, name: str = "runworker") -> subprocess.Popen[bytes]:
        proc, _ = self.procs.spawn(
            [PYTHON, "manage.py", "runworker", *options], env=self.env, name=name
        )
        return proc

    def check_exit(self, procs: list[subprocess.Popen[bytes]], what: str) -> None:
        for proc in procs:
            if proc.returncode not in (0, None):
                raise BenchError(
                    f"{what}: pid {proc.pid} exited {proc.returncode}; log tail:\n"
                    + self.procs.log_tail(proc)
                )

    def summaries(self, procs: list[subprocess.Popen[bytes]]) -> list[dict[str, Any]]:
        out = []
        for proc in procs:
            for line in reversed(self.procs.log_tail(proc, 5).splitlines()):
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        out.append(json.loads(line))
                    break
        return out

    # --- figures from the rows' own timestamps ------------------------------------------------

    def drain_stats(self, work_type: str = "bench.noop") -> dict[str, Any]:
        row = self.sql(
            """
            SELECT count(*) FILTER (WHERE status = 'completed'),
                   count(*),
                   count(*) FILTER (WHERE lease_token <> 1),
                   extract(epoch FROM max(completed_at) - min(started_at)),
                   percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
                       ORDER BY extract(epoch FROM started_at - created_at) * 1000),
                   percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
                       ORDER BY extract(epoch FROM completed_at - started_at) * 1000),
                   count(DISTINCT lease_holder) FILTER (WHERE status = 'in_progress')
            FROM work_items WHERE work_type = %s
            """,
            [work_type],
        )[0]
        completed, total, reclaimed, span, e2s, s2c, _ = row
        span = float(span or 0.0)
        return {
            "items": total,
            "completed": completed,
            "claimed_more_than_once": reclaimed,
            "span_s": round(span, 3),
            "jobs_per_s": round(completed / span, 1) if span > 0 else None,
            "enqueue_to_start_ms": {"p50": _r(e2s and e2s[0]), "p99": _r(e2s and e2s[1])},
            "start_to_complete_ms": {"p50": _r(s2c and s2c[0]), "p99": _r(s2c and s2c[1])},
        }

    # --- scenario plumbing --------------------------------------------------------------------

    def run_scenario(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        progress(f"scenario {name}")
        started = time.perf_counter()
        load_before = round(os.getloadavg()[0], 2)
        try:
            record = fn()
        except Exception as exc:
            self.failed.append(name)
            record = {"error": f"{type(exc).__name__}: {exc}", "logs": str(self.log_dir)}
            progress(f"scenario {name} FAILED: {exc}\n{traceback.format_exc()}")
            self.procs.cleanup()
        record = {
            "scenario": name,
            **record,
            "bench_seconds": round(time.perf_counter() - started, 1),
            "loadavg_1m": [load_before, round(os.getloadavg()[0], 2)],
        }
        self.results[name] = record
        emit(record)

    # --- machine ------------------------------------------------------------------------------

    def machine(self) -> dict[str, Any]:
        import django
        import psycopg

        settings = dict(
            self.sql(
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
            "postgresql": self.one("SHOW server_version"),
            "pg_settings": settings,
            "python": platform.python_version(),
            "django": django.get_version(),
            "psycopg": psycopg.__version__,
            "git_commit": commit,
            "quick": bool(self.args.quick),
            "sizes": asdict(self.sizes),
            "runworker_options": list(RUNWORKER_OPTIONS),
        }

    # --- 3. enqueue ---------------------------------------------------------------------------

    def scenario_enqueue(self) -> dict[str, Any]:
        from leasing import enqueue_many

        n = self.sizes.enqueue_items
        self.reset()
        self.vacuum_analyze()
        specs = [
            {"task_id": f"task-{i}", "work_type": "bench.noop", "input_data": {"i": i}}
            for i in range(n)
        ]
        start = time.perf_counter()
        items = enqueue_many(specs)
        seconds = time.perf_counter() - start
        stored = self.one("SELECT count(*) FROM work_items")
        if len(items) != n or stored != n:
            raise BenchError(f"enqueue_many returned {len(items)} items, {stored} stored, not {n}")
        result: dict[str, Any] = {
            "items": n,
            "seconds": round(seconds, 3),
            "items_per_s": round(n / seconds),
        }
        if n >= 100_000:
            result["target_s"] = TARGETS["enqueue_100k_s"]
            result["met"] = seconds < TARGETS["enqueue_100k_s"]
        return result

    # --- 1. throughput, 2. ceiling ------------------------------------------------------------

    def _gated_drain(
        self, n: int, m: int, kind: str, spawn: Callable[[int], subprocess.Popen[bytes]]
    ) -> dict[str, Any]:
        """Drain m no-op items with n processes that all start claiming at the same instant.

        A gate transaction holds `LOCK TABLE work_items IN EXCLUSIVE MODE`
        (reads pass, writes wait) while the processes start, so each blocks on
        its first claim; once all n wait on the lock, the gate commits. Python
        and Django start-up are thus outside the measured drain, yet the
        processes are the real thing (`runworker --burst`).
        """
        from bench.common import connect

        self.reset()
        self.enqueue_noop(m)
        self.vacuum_analyze()
        self.checkpoint()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        gate = connect(self.url, autocommit=False)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            gate.execute("LOCK TABLE work_items IN EXCLUSIVE MODE")
            spawned = time.perf_counter()
            procs = [spawn(i) for i in range(n)]
            wait_for(
                lambda: all(p.poll() is None for p in procs) and self._blocked_on_gate() >= n,
                90,
                f"{n} {kind} processes to reach their first claim",
                interval_s=0.01,
            )
            startup = time.perf_counter() - spawned
            cpu_at_gate = sum(_proc_cpu_s(p.pid) for p in procs)
            cpu0 = _cpu_times()
            gate.commit()
            start = time.perf_counter()
        finally:
            gate.close()
        self.procs.wait_all(procs, timeout_s=max(120.0, m / 50), what=kind)
        wall = time.perf_counter() - start
        cpu1, ru1 = _cpu_times(), resource.getrusage(resource.RUSAGE_CHILDREN)
        self.check_exit(procs, kind)
        stats = self.drain_stats()
        if stats["completed"] != m:
            raise BenchError(f"{kind} drained {stats['completed']} of {m} items")
        child_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime) - cpu_at_gate
        return {
            "workers": n,
            **stats,
            "wall_s": round(wall, 3),
            "wall_jobs_per_s": round(m / wall, 1),
            "startup_s": round(startup, 2),
            "client_cpu_ms_per_job": round(child_cpu * 1000 / m, 3),
            "machine_cpu_busy_pct": _busy_pct(cpu0, cpu1),
        }

    def _blocked_on_gate(self) -> int:
        return self.one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query ILIKE '%%work_items%%'"
        )

    def drain_runworker(
        self, n: int, m: int, options: tuple[str, ...] = RUNWORKER_OPTIONS
    ) -> dict[str, Any]:
        procs: list[subprocess.Popen[bytes]] = []

        def spawn(i: int) -> subprocess.Popen[bytes]:
            proc = self.runworker("--burst", "--json", *options, name=f"drain-n{n}-{i}")
            procs.append(proc)
            return proc

        result = self._gated_drain(n, m, "runworker --burst", spawn)
        result["completed_per_worker"] = [s.get("completed", 0) for s in self.summaries(procs)]
        return result

    def drain_ceiling(self, n: int, m: int) -> dict[str, Any]:
        def spawn(i: int) -> subprocess.Popen[bytes]:
            return self.procs.spawn(
                [PYTHON, "-m", "bench.ceiling", self.url, f"ceiling-{i}"],
                env=self.env,
                name=f"ceiling-n{n}-{i}",
            )[0]

        return self._gated_drain(n, m, "plain psycopg loop", spawn)

    def scenario_throughput(self) -> dict[str, Any]:
        runs = []
        for n in self.sizes.workers:
            progress(f"  runworker x{n}: {self.sizes.items} items")
            run = self.drain_runworker(n, self.sizes.items)
            progress(f"    {run['jobs_per_s']} jobs/s")
            runs.append(run)
        return {
            "items": self.sizes.items,
            "runworker_options": ["--burst", *RUNWORKER_OPTIONS],
            "runs": runs,
        }

    def scenario_ceiling(self) -> dict[str, Any]:
        runs = []
        library = {r["workers"]: r for r in self.results.get("throughput", {}).get("runs", [])}
        for n in self.sizes.workers:
            progress(f"  plain psycopg x{n}: {self.sizes.items} items")
            run = self.drain_ceiling(n, self.sizes.items)
            lib = library.get(n)
            if lib and lib.get("jobs_per_s") and run.get("jobs_per_s"):
                run["ratio_runworker_to_ceiling"] = round(lib["jobs_per_s"] / run["jobs_per_s"], 3)
                run["ratio_wall"] = round(lib["wall_jobs_per_s"] / run["wall_jobs_per_s"], 3)
            progress(
                f"    {run['jobs_per_s']} jobs/s, ratio {run.get('ratio_runworker_to_ceiling')}"
            )
            runs.append(run)
        return {"items": self.sizes.items, "runs": runs}

    def scenario_options(self) -> dict[str, Any]:
        """Each option set drains the same items `options_repeats` times, interleaved.

        On a shared machine a single short drain swings by tens of percent with
        whatever else runs; the best of the repeats is the closest to what the
        configuration can do, the median is reported beside it.
        """
        n, m = self.sizes.options_workers, self.sizes.options_items
        grid = OPTION_GRID if not self.args.quick else OPTION_GRID[:2]
        samples: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in grid}
        for repeat in range(self.sizes.options_repeats):
            for label, options in grid:
                progress(f"  runworker x{n} {label} (run {repeat + 1}): {m} items")
                run = self.drain_runworker(n, m, options)
                progress(f"    {run['jobs_per_s']} jobs/s")
                samples[label].append(run)
        runs = []
        for label, options in grid:
            rates = [r["jobs_per_s"] or 0.0 for r in samples[label]]
            runs.append(
                {
                    "config": label,
                    "options": list(options),
                    "jobs_per_s": max(rates),
                    "jobs_per_s_median": round(statistics.median(rates), 1),
                    "jobs_per_s_each": rates,
                    "completed": min(r["completed"] for r in samples[label]),
                    "items": m,
                    "claimed_more_than_once": max(
                        r["claimed_more_than_once"] for r in samples[label]
                    ),
                    "wall_jobs_per_s": max(r["wall_jobs_per_s"] for r in samples[label]),
                    "client_cpu_ms_per_job": min(
                        r["client_cpu_ms_per_job"] for r in samples[label]
                    ),
                    "start_to_complete_ms": samples[label][0]["start_to_complete_ms"],
                }
            )
        best = max(runs, key=lambda r: r["jobs_per_s"])
        return {"items": m, "workers": n, "repeats": self.sizes.options_repeats, "runs": runs,
                "best": best["config"]}  # fmt: skip

    # --- 1b. claim latency --------------------------------------------------------------------

    def _claimers(
        self, claimers: int, batch: int, count: int, think_ms: float = 0.0
    ) -> dict[str, Any]:
        from bench.common import connect

        self.reset()
        self.enqueue_noop(claimers * batch * (count + 1) + 1000)
        self.vacuum_analyze()
        self.checkpoint()
        explain_before = self.explain_claim(batch)
        outs, procs = [], []
        # The same gate as the drains: every claimer blocks on its first
        # (untimed) claim until all are ready, then they start together.
        gate = connect(self.url, autocommit=False)
        try:
            gate.execute("LOCK TABLE work_items IN EXCLUSIVE MODE")
            for i in range(claimers):
                out = self.log_dir / f"claim-{claimers}x{batch}-{think_ms:g}-{i}.json"
                outs.append(out)
                args = [PYTHON, "-m", "bench.claimer", f"claimer-{i}", str(out), "--batch",
                        str(batch), "--count", str(count), "--think-ms", str(think_ms)]  # fmt: skip
                procs.append(
                    self.procs.spawn(args, env=self.env, name=f"claimer-{claimers}x{batch}-{i}")[0]
                )
            wait_for(
                lambda: (
                    all(p.poll() is None for p in procs) and self._blocked_on_gate() >= claimers
                ),
                90,
                f"{claimers} claimers to reach their first claim",
                interval_s=0.01,
            )
            gate.commit()
        finally:
            gate.close()
        self.procs.wait_all(procs, timeout_s=120, what="claimer")
        self.check_exit(procs, "claimer")
        durations = []
        for out in outs:
            durations += [ns / 1e6 for ns in json.loads(out.read_text())["durations_ns"]]
        explain_after = self.explain_claim(batch)
        return {
            "claimers": claimers,
            "batch": batch,
            "think_ms": think_ms,
            "claim_ms": summary_ms(durations, 3),
            "server_explain_ms_fresh_backlog": explain_before,
            "server_explain_ms_after_drain": explain_after,
        }

    def explain_claim(self, batch: int) -> dict[str, Any] | None:
        """EXPLAIN ANALYZE of the very claim statement acquire_leases sends (rolled back)."""
        from django.db import connection, transaction

        from leasing import LeaseManager

        captured: list[tuple[str, Any]] = []

        def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            captured.append((sql, params))
            return execute(sql, params, many, context)

        class Rollback(Exception):
            pass

        with contextlib.suppress(Rollback), transaction.atomic():
            with connection.execute_wrapper(capture):
                LeaseManager("explain").acquire_leases(batch, 300, work_type_filter=["bench.noop"])
            raise Rollback
        claim = next((c for c in captured if "SKIP LOCKED" in c[0]), None)
        if claim is None:
            return None
        with contextlib.suppress(Rollback), transaction.atomic():
            plan = self.sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + claim[0], claim[1])
            raise Rollback
        doc = plan[0][0]
        doc = json.loads(doc) if isinstance(doc, str) else doc
        top = doc[0]
        scans = []
        _walk_plan(top["Plan"], scans)
        return {
            "execution_ms": round(top["Execution Time"], 3),
            "planning_ms": round(top["Planning Time"], 3),
            "shared_buffers_hit": top["Plan"].get("Shared Hit Blocks"),
            "scans": scans,
        }

    def scenario_claim(self) -> dict[str, Any]:
        count, batch_count = self.sizes.claim_count, self.sizes.claim_batch_count
        runs = []
        plan = [(1, 1, count, 0.0), (4, 1, count, 0.0), (4, 1, count, 5.0)]
        if not self.args.quick:
            plan.append((4, 32, batch_count, 0.0))
        for claimers, batch, n, think in plan:
            progress(f"  {claimers} claimer(s), batch {batch}, think {think} ms, {n} claims each")
            run = self._claimers(claimers, batch, n, think)
            progress(f"    claim ms {run['claim_ms']}")
            runs.append(run)
        for run in runs:
            p99 = run["claim_ms"].get("p99")
            run["met"] = p99 is not None and p99 < TARGETS["claim_p99_ms"]
        saturated = next(
            r for r in runs if r["claimers"] == 4 and r["batch"] == 1 and not r["think_ms"]
        )
        paced = next(r for r in runs if r["claimers"] == 4 and r["batch"] == 1 and r["think_ms"])
        return {
            "measures": "client-side duration of LeaseManager.acquire_leases(batch, 300, "
            "work_type_filter=['bench.noop']) per call in concurrent claimer processes that "
            "complete what they claim with complete_many (then pause think_ms); plus EXPLAIN "
            "ANALYZE of the claim SQL before and after the drain",
            "runs": runs,
            "p99_ms_4_claimers_saturated": saturated["claim_ms"].get("p99"),
            "p99_ms_4_claimers_paced": paced["claim_ms"].get("p99"),
            "target_p99_ms": TARGETS["claim_p99_ms"],
            "met": saturated["met"] and paced["met"],
        }

    # --- 4. pickup latency --------------------------------------------------------------------

    def _ready_workers(self, n: int) -> bool:
        running = self.one(
            "SELECT count(*) FROM workers WHERE role = 'worker' AND status = 'running'"
        )
        listening = self.one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND left(query, 6) = 'LISTEN'"
        )
        return running >= n and listening >= n

    def _pickup(self, n: int) -> dict[str, Any]:
        from leasing import enqueue

        self.reset()
        self.vacuum_analyze()
        procs = [self.runworker(name=f"pickup-{n}-{i}") for i in range(n)]
        try:
            wait_for(lambda: self._ready_workers(n), 60, f"{n} idle workers listening")
            warmup = 5
            lo, hi = self.sizes.pickup_gap_ms
            for i in range(warmup + self.sizes.pickup_items):
                enqueue(f"pickup-{i}", "bench.noop", input_data={"i": i})
                if i < warmup:
                    wait_for(
                        lambda i=i: self.one(
                            "SELECT count(*) FROM work_items WHERE task_id = %s "
                            "AND status = 'completed'",
                            [f"pickup-{i}"],
                        ),
                        10,
                        "a warm-up item",
                    )
                time.sleep(random.uniform(lo, hi) / 1000)
            total = warmup + self.sizes.pickup_items
            wait_for(
                lambda: (
                    self.one("SELECT count(*) FROM work_items WHERE status = 'completed'") >= total
                ),
                30,
                "every pickup item to complete",
                interval_s=0.05,
            )
            rows = self.sql(
                """
                SELECT extract(epoch FROM started_at - created_at) * 1000,
                       extract(epoch FROM completed_at - started_at) * 1000
                FROM work_items WHERE (input_data->>'i')::int >= %s
                """,
                [warmup],
            )
        finally:
            for proc in procs:
                self.procs.stop(proc, grace_s=15)
        self.check_exit(procs, "idle runworker")
        pickup = [float(r[0]) for r in rows]
        return {
            "workers": n,
            "items": len(pickup),
            "pickup_ms": summary_ms(pickup, 2),
            "start_to_complete_ms": summary_ms([float(r[1]) for r in rows], 2),
            "over_100ms": sum(1 for x in pickup if x > 100),
        }

    def scenario_pickup(self) -> dict[str, Any]:
        runs = []
        for n in self.sizes.pickup_workers:
            progress(f"  {n} idle worker(s), {self.sizes.pickup_items} single enqueues")
            run = self._pickup(n)
            progress(f"    pickup ms {run['pickup_ms']}")
            runs.append(run)
        worst = max(r["pickup_ms"]["p50"] for r in runs)
        return {
            "measures": "started_at - created_at (database clock) of items enqueued one at a "
            "time with enqueue() every 20-50 ms, idle `runworker` (no options) processes woken "
            "by NOTIFY; 5 warm-up items excluded",
            "runs": runs,
            "worst_p50_ms": worst,
            "target_p50_ms": TARGETS["pickup_p50_ms"],
            "met": worst < TARGETS["pickup_p50_ms"],
        }

    # --- 5. recovery latency ------------------------------------------------------------------

    def scenario_recovery(self) -> dict[str, Any]:
        s = self.sizes
        self.reset()
        sweeper, _ = self.procs.spawn(
            [PYTHON, "manage.py", "recoverysweep", "--interval",
             str(s.recovery_sweep_interval_s), "--json", "--worker-id", "bench-sweeper"],
            env=self.env,
            name="recovery-sweeper",
        )  # fmt: skip
        rounds = []
        try:
            wait_for(
                lambda: self.one(
                    "SELECT count(*) FROM workers WHERE worker_id = 'bench-sweeper' "
                    "AND status = 'running'"
                ),
                60,
                "the recovery sweep to start",
            )
            for index in range(s.recovery_rounds):
                progress(f"  round {index + 1}/{s.recovery_rounds}")
                rounds.append(self._recovery_round(index))
        finally:
            self.procs.stop(sweeper, grace_s=15)
        self.check_exit([sweeper], "recoverysweep")
        total = [x for r in rounds for x in r["kill_to_reclaim_s_each"]]
        bound = s.recovery_lease_s + s.recovery_sweep_interval_s + TARGETS["recovery_slack_s"]
        return {
            "measures": "k bench.sleep items held by a runworker (lease L, renewals every H) "
            "that is SIGKILLed; `recoverysweep --interval S` re-queues them, an idle runworker "
            "re-claims them: new lease_acquired_at - statement_timestamp() right after the "
            "kill, split at the expired lease_expires_at and the sweep's error_boundary "
            "checkpoint (all database clock)",
            "items": s.recovery_items,
            "rounds": s.recovery_rounds,
            "lease_s": s.recovery_lease_s,
            "heartbeat_s": s.recovery_heartbeat_s,
            "sweep_interval_s": s.recovery_sweep_interval_s,
            "kill_to_reclaim_s": _sec_summary(total),
            "per_round": [{k: v for k, v in r.items() if not k.endswith("_each")} for r in rounds],
            "bound_s": bound,
            "met": max(total) <= bound,
        }

    def _recovery_round(self, index: int) -> dict[str, Any]:
        from leasing import enqueue_many

        s = self.sizes
        k = s.recovery_items
        victim_id, rescuer_id = f"bench-victim-{index}", f"bench-rescuer-{index}"
        self.sql("TRUNCATE work_items, checkpoints CASCADE")
        enqueue_many(
            [
                {"task_id": f"rec-{i}", "work_type": "bench.sleep", "input_data": {"seconds": 120}}
                for i in range(k)
            ]
        )
        victim = self.runworker(
            "--work-type", "bench.sleep", "--concurrency", str(k), "--prefetch", "0",
            "--lease-seconds", str(s.recovery_lease_s),
            "--heartbeat-interval", str(s.recovery_heartbeat_s),
            "--worker-id", victim_id,
            name=f"recovery-victim-{index}",
        )  # fmt: skip
        rescuer = None
        try:
            wait_for(
                lambda: (
                    self.one(
                        "SELECT count(*) FROM work_items WHERE lease_holder = %s "
                        "AND status = 'in_progress'",
                        [victim_id],
                    )
                    == k
                ),
                60,
                f"the victim worker to hold all {k} items",
            )
            rescuer = self.runworker(
                "--work-type", "bench.sleep", "--concurrency", str(k), "--prefetch", "0",
                "--shutdown-timeout", "1", "--worker-id", rescuer_id,
                name=f"recovery-rescuer-{index}",
            )  # fmt: skip
            wait_for(
                lambda: (
                    self.one(
                        "SELECT count(*) FROM workers WHERE worker_id = %s AND status = 'running'",
                        [rescuer_id],
                    )
                    and self._listening() >= 2
                ),
                60,
                "the rescuing worker",
            )
            time.sleep(2 * s.recovery_heartbeat_s)  # a renewal or two in steady state
            victim.kill()  # SIGKILL
            kill_at = self.one("SELECT statement_timestamp()")
            victim.wait(timeout=10)
            wait_for(
                lambda: (
                    self.one(
                        "SELECT count(*) FROM work_items WHERE lease_holder = %s", [rescuer_id]
                    )
                    == k
                ),
                60,
                "the rescuing worker to re-claim every item",
                interval_s=0.05,
            )
            rows = self.sql(
                """
                SELECT extract(epoch FROM w.lease_acquired_at - %s),
                       extract(epoch FROM (c.snapshot_data->>'lease_expires_at')::timestamptz - %s),
                       extract(epoch FROM c.created_at
                                          - (c.snapshot_data->>'lease_expires_at')::timestamptz),
                       extract(epoch FROM w.lease_acquired_at - c.created_at)
                FROM work_items w
                JOIN checkpoints c ON c.work_item_id = w.work_item_id
                                  AND c.checkpoint_type = 'error_boundary'
                """,
                [kill_at, kill_at],
            )
        finally:
            if rescuer is not None:
                self.procs.stop(rescuer, grace_s=15)
            self.procs.stop(victim, grace_s=1)
        if len(rows) != k:
            raise BenchError(f"{len(rows)} of {k} items have a recovery checkpoint")
        total = [float(r[0]) for r in rows]
        return {
            "kill_to_reclaim_s": _sec_summary(total),
            "kill_to_lease_expiry_s": _sec_summary([float(r[1]) for r in rows]),
            "expiry_to_sweep_s": _sec_summary([float(r[2]) for r in rows]),
            "sweep_to_reclaim_s": _sec_summary([float(r[3]) for r in rows]),
            "kill_to_reclaim_s_each": total,
        }

    def _listening(self) -> int:
        return self.one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND left(query, 6) = 'LISTEN'"
        )

    # --- 6. sweep -----------------------------------------------------------------------------

    def load_sweep_rows(self, rows: int) -> float:
        """`rows` work items: 2% pending, 0.1% live leases, 1% failed, the rest completed."""
        start = time.perf_counter()
        self.reset()
        pending, live, failed = rows // 50, max(rows // 1000, 1), rows // 100
        self.sql(
            """
            INSERT INTO work_items (
                work_item_id, task_id, work_type, status, priority, lease_holder, lease_token,
                lease_acquired_at, lease_expires_at, lease_deadline_at, heartbeat_at,
                retry_count, max_retries, queue_name, input_data, output_data, created_at,
                started_at, completed_at, updated_at)
            SELECT lpad(g::text, 26, '0'), 'task-' || g, 'bench.noop',
                   CASE WHEN g <= %(live)s THEN 'in_progress'
                        WHEN g <= %(live)s + %(pending)s THEN 'pending'
                        WHEN g <= %(live)s + %(pending)s + %(failed)s THEN 'failed'
                        ELSE 'completed' END,
                   0,
                   CASE WHEN g <= %(live)s THEN 'bench-live-worker' END,
                   CASE WHEN g <= %(live)s + %(pending)s AND g > %(live)s THEN 0 ELSE 1 END,
                   CASE WHEN g <= %(live)s THEN now() END,
                   CASE WHEN g <= %(live)s THEN now() + interval '1 hour' END,
                   CASE WHEN g <= %(live)s THEN now() + interval '4 hours' END,
                   CASE WHEN g <= %(live)s THEN now() END,
                   0, 3, 'default', '{"n": 1}'::jsonb, NULL,
                   now() - interval '1 day' + g * interval '1 ms',
                   CASE WHEN g > %(live)s + %(pending)s OR g <= %(live)s
                        THEN now() - interval '1 day' + g * interval '1 ms' END,
                   CASE WHEN g > %(live)s + %(pending)s
                        THEN now() - interval '1 day' + g * interval '1 ms' END,
                   now()
            FROM generate_series(1, %(rows)s) AS g
            """,
            {"rows": rows, "live": live, "pending": pending, "failed": failed},
        )
        return time.perf_counter() - start

    def expire(self, count: int) -> None:
        """Turn the newest `count` completed rows into in_progress items whose lease ran out."""
        self.sql(
            """
            UPDATE work_items SET status = 'in_progress', lease_holder = 'bench-dead-worker',
                   lease_token = lease_token + 1, completed_at = NULL,
                   lease_acquired_at = now() - interval '10 minutes',
                   heartbeat_at = now() - interval '6 minutes',
                   lease_expires_at = now() - interval '5 minutes' + random() * interval '1 minute',
                   lease_deadline_at = now() + interval '4 hours'
            WHERE work_item_id IN (
                SELECT work_item_id FROM work_items WHERE status = 'completed'
                ORDER BY work_item_id DESC LIMIT %s)
            """,
            [count],
        )

    def scenario_sweep(self) -> dict[str, Any]:
        rows = self.sizes.sweep_rows
        progress(f"  loading {rows} rows")
        load_s = self.load_sweep_rows(rows)
        runs = [self._sweep_once(expired) for expired in self.sizes.sweep_expired]
        # The same passes without their error_boundary checkpoints
        # (`recoverysweep --no-checkpoints`): what the checkpoints cost.
        runs += [
            self._sweep_once(expired, "without error_boundary checkpoints", checkpoints=False)
            for expired in self.sizes.sweep_expired
        ]
        return {
            "measures": "wall time of the first RecoverySweep(scan_interval_seconds=60)"
            ".scan_and_recover() in a fresh process (recovery + checkpoints + retention + keys "
            "+ lost workers), after VACUUM ANALYZE; and of the pass right after it",
            "rows": rows,
            "load_s": round(load_s, 1),
            "runs": runs,
        }

    def _sweep_once(
        self, expired: int, variant: str = "as migrated", *, checkpoints: bool = True
    ) -> dict[str, Any]:
        rows = self.sizes.sweep_rows
        self.sql("TRUNCATE checkpoints")
        self.sql(
            "UPDATE work_items SET status = 'completed', completed_at = now(), "
            "retry_count = 0, error_message = NULL, lease_holder = NULL, "
            "lease_expires_at = NULL WHERE status IN ('pending', 'failed') AND retry_count > 0"
        )
        self.expire(expired)
        self.vacuum_analyze()
        self.vacuum_analyze("checkpoints")
        progress(f"  sweeping {expired} expired among {rows} ({variant})")
        out = self.log_dir / f"sweep-{expired}-{len(variant)}.json"
        command = [PYTHON, "-m", "bench.sweeper", str(out)]
        if not checkpoints:
            command.append("--no-checkpoints")
        proc, _ = self.procs.spawn(command, env=self.env, name=f"sweep-{expired}")
        limit = self.args.sweep_timeout
        try:
            self.procs.wait_all([proc], timeout_s=limit, what="sweep pass")
        except BenchError:
            self.procs.stop(proc, grace_s=2)
            progress(f"    still running after {limit:g} s: stopped")
            return {"expired": expired, "variant": variant, "timed_out_after_s": limit,
                    "met": False}  # fmt: skip
        self.check_exit([proc], "sweep pass")
        result = json.loads(out.read_text())
        first, second = result["first"], result["second"]
        outcome = (first["expired_found"], first["recovered"], first["errors"])
        if outcome != (expired, expired, 0):
            raise BenchError(
                f"sweep found {first['expired_found']}, recovered "
                f"{first['recovered']} of {expired}, {first['errors']} errors"
            )
        wall_ms = first["wall_ms"]
        run = {
            "expired": expired,
            "variant": variant,
            "wall_ms": wall_ms,
            "scan_duration_ms": first["scan_duration_ms"],
            "batches": first["batches"],
            "checkpoints_created": first["checkpoints_created"],
            "next_pass_nothing_expired_ms": second["wall_ms"],
            "next_pass_expired_found": second["expired_found"],
        }
        if variant == "as migrated" and expired == 1_000:
            run["target_ms"] = TARGETS["sweep_1k_ms"]
            run["met"] = wall_ms < TARGETS["sweep_1k_ms"]
        elif variant == "as migrated" and expired == 100_000:
            run["target_ms"] = TARGETS["sweep_100k_s"] * 1000
            run["met"] = wall_ms < TARGETS["sweep_100k_s"] * 1000
        progress(f"    {wall_ms:.1f} ms ({first['batches']} batches)")
        return run

    # --- 7. heartbeat cost --------------------------------------------------------------------

    def _renew_rounds(
        self, manager: Any, seconds: float, extend_below: float | None = None
    ) -> dict[str, Any]:
        from django.db import connection

        def counters() -> tuple[int, int]:
            # Flush this backend's pending statistics, then read them fresh.
            self.sql("SELECT pg_stat_force_next_flush()")
            self.sql("SELECT 1")
            self.sql("SELECT pg_stat_clear_snapshot()")
            row = self.sql(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relname = 'work_items'"
            )[0]
            return int(row[0]), int(row[1])

        held = len(manager.held_leases())
        upd0, hot0 = counters()
        durations = []
        renewed = lost = 0
        deadline = time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < deadline or not durations:
            t0 = time.perf_counter()
            ok, gone = manager.renew_leases(None, 300, extend_below=extend_below)
            durations.append((time.perf_counter() - t0) * 1000)
            renewed += len(ok)
            lost += len(gone)
        elapsed = time.perf_counter() - start
        upd1, hot1 = counters()
        connection.close()
        d_upd, d_hot = upd1 - upd0, hot1 - hot0
        return {
            "leases": held,
            "rounds": len(durations),
            "renewed": renewed,
            "lost": lost,
            "renewals_per_s": round(renewed / elapsed),
            "round_ms": summary_ms(durations, 2),
            "n_tup_upd": d_upd,
            "n_tup_hot_upd": d_hot,
            "hot_share": round(d_hot / d_upd, 3) if d_upd else None,
        }

    def scenario_heartbeat(self) -> dict[str, Any]:
        from leasing import LeaseManager

        n = self.sizes.heartbeat_leases
        self.reset()
        self.enqueue_noop(n)
        self.vacuum_analyze()
        manager = LeaseManager("bench-heartbeat")
        leases = manager.acquire_leases(min(n, 1000), 300, work_type_filter=["bench.noop"])
        while len(manager.held_leases()) < n:
            more = manager.acquire_leases(
                min(n - len(manager.held_leases()), 1000), 300, work_type_filter=["bench.noop"]
            )
            if not more:
                break
            leases += more
        if len(manager.held_leases()) != n:
            raise BenchError(f"could claim only {len(manager.held_leases())} of {n} leases")
        self.vacuum_analyze()
        # What runworker's renewer does: extend only when under half the lease
        # is left, so the indexed expiry stays put and the update can be HOT.
        # In steady state (a renewal every lease/10) one renewal in five or six
        # extends; this loop runs within the first half of the lease, so it
        # shows the cost and HOT share of the renewals that do not.
        worker_renewer = self._renew_rounds(manager, self.sizes.heartbeat_seconds, extend_below=150)
        # renew_lease() semantics: every renewal moves the expiry (never HOT,
        # since work_items_lease_expiry_idx indexes it).
        as_migrated = self._renew_rounds(manager, self.sizes.heartbeat_seconds)
        # What-if, in this throwaway database only: without the partial index on
        # lease_expires_at, no index covers a column a renewal changes, so
        # PostgreSQL can use HOT updates (given free space in the page).
        variants: dict[str, Any] = {}
        with self.without_lease_expiry_index() as dropped:
            if dropped:
                self.vacuum_analyze()
                variants["no_lease_expiry_idx"] = self._renew_rounds(
                    manager, self.sizes.heartbeat_seconds
                )
                self.sql("ALTER TABLE work_items SET (fillfactor = 70)")
                try:
                    self.sql("VACUUM FULL work_items")
                    self.vacuum_analyze()
                    variants["no_lease_expiry_idx_fillfactor70"] = self._renew_rounds(
                        manager, self.sizes.heartbeat_seconds
                    )
                finally:
                    self.sql("ALTER TABLE work_items RESET (fillfactor)")
        if as_migrated["lost"]:
            raise BenchError(f"{as_migrated['lost']} leases were lost while renewing")
        return {
            "measures": "LeaseManager.renew_leases() of every held lease (one UPDATE ... FROM "
            "unnest per 1000) in a loop; HOT share = delta n_tup_hot_upd / delta n_tup_upd of "
            "work_items over the loop. What-ifs (this throwaway database only): without "
            "work_items_lease_expiry_idx no index covers a column a renewal changes",
            "worker_renewer": worker_renewer,
            "as_migrated": as_migrated,
            "what_if": variants,
        }

    @contextlib.contextmanager
    def without_lease_expiry_index(self) -> Any:
        """Drop work_items_lease_expiry_idx for a what-if measurement; put it back after."""
        index_sql = self.one(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = 'work_items_lease_expiry_idx'"
        )
        if not index_sql:
            yield False
            return
        self.sql("DROP INDEX work_items_lease_expiry_idx")
        try:
            yield True
        finally:
            self.sql(index_sql)


# --- helpers ---------------------------------------------------------------------------------


def _r(value: Any, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)


def _sec_summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": round(min(values), 3),
        "p50": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def _walk_plan(node: dict[str, Any], out: list[dict[str, Any]]) -> None:
    if "Scan" in node.get("Node Type", ""):
        out.append(
            {
                "node": node["Node Type"],
                "index": node.get("Index Name"),
                "rows": node.get("Actual Rows"),
                "heap_fetches": node.get("Heap Fetches"),
                "removed_by_filter": node.get("Rows Removed by Filter"),
                "buffers": node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0),
            }
        )
    for child in node.get("Plans", []):
        _walk_plan(child, out)


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process, in seconds (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _busy_pct(a: tuple[int, int], b: tuple[int, int]) -> float | None:
    total = b[1] - a[1]
    return round(100 * (b[0] - a[0]) / total, 1) if total > 0 else None


# --- the readable table ----------------------------------------------------------------------


def table(results: dict[str, dict[str, Any]]) -> str:
    lines: list[tuple[str, str, str, str]] = []

    def add(metric: str, value: Any, target: str = "", met: bool | None = None) -> None:
        status = "" if met is None else ("met" if met else "MISSED")
        lines.append((metric, str(value), target, status))

    m = results.get("machine", {})
    if m:
        pg = m.get("pg_settings", {})
        add(
            "machine",
            f"{m.get('nproc')} CPU, PostgreSQL {m.get('postgresql')}, "
            f"synchronous_commit={pg.get('synchronous_commit')}, fsync={pg.get('fsync')}",
        )
    for name in SCENARIOS:
        r = results.get(name)
        if r is None:
            continue
        if "error" in r:
            add(name, f"ERROR {r['error']}", "", False)
            continue
        if name == "enqueue":
            add(
                f"enqueue_many {r['items']:,} items",
                f"{r['seconds']:.2f} s ({r['items_per_s']:,}/s)",
                "< 5 s" if "met" in r else "",
                r.get("met"),
            )
        elif name == "throughput":
            for run in r["runs"]:
                add(
                    f"runworker x{run['workers']} jobs/s (rows | wall)",
                    f"{run['jobs_per_s']} | {run['wall_jobs_per_s']}",
                )
                add(
                    f"  x{run['workers']} enqueue->start p50/p99 ms",
                    f"{run['enqueue_to_start_ms']['p50']} / {run['enqueue_to_start_ms']['p99']}",
                )
                add(
                    f"  x{run['workers']} client CPU ms/job, machine busy %",
                    f"{run['client_cpu_ms_per_job']}, {run['machine_cpu_busy_pct']}",
                )
        elif name == "ceiling":
            for run in r["runs"]:
                n = run["workers"]
                ratio = run.get("ratio_runworker_to_ceiling")
                target, met = "", None
                if ratio is not None and n in (1, 4):
                    need = TARGETS["ratio_n4"] if n == 4 else TARGETS["ratio_n1"]
                    target, met = f">= {need}", ratio >= need
                add(
                    f"psycopg loop x{n} jobs/s (rows | wall)",
                    f"{run['jobs_per_s']} | {run['wall_jobs_per_s']}",
                )
                add(
                    f"  x{n} client CPU ms/job, machine busy %",
                    f"{run['client_cpu_ms_per_job']}, {run['machine_cpu_busy_pct']}",
                )
                if ratio is not None:
                    add(f"  ratio runworker/psycopg x{n} (rows)", ratio, target, met)
        elif name == "options":
            for run in r["runs"]:
                each = " / ".join(f"{x:g}" for x in run["jobs_per_s_each"])
                add(f"options x{r['workers']} {run['config']}", f"{each} jobs/s")
        elif name == "claim":
            for run in r["runs"]:
                c = run["claim_ms"]
                is_target = run["claimers"] == 4 and run["batch"] == 1
                think = f" think {run['think_ms']:g} ms" if run["think_ms"] else " flat out"
                add(
                    f"claim ms, {run['claimers']} claimer(s) batch {run['batch']}{think} p50/p99",
                    f"{c.get('p50')} / {c.get('p99')}",
                    "p99 < 5" if is_target else "",
                    run.get("met") if is_target else None,
                )
        elif name == "pickup":
            for run in r["runs"]:
                p = run["pickup_ms"]
                add(
                    f"idle pickup ms, {run['workers']} worker(s) p50/p99",
                    f"{p['p50']} / {p['p99']}",
                    "p50 < 20",
                    p["p50"] < TARGETS["pickup_p50_ms"],
                )
        elif name == "recovery":
            t = r["kill_to_reclaim_s"]
            add(
                f"recovery s (lease {r['lease_s']:g}, sweep {r['sweep_interval_s']:g}), "
                f"{r['rounds']} kill(s), p50/max",
                f"{t['p50']} / {t['max']}",
                f"<= {r['bound_s']:g}",
                r["met"],
            )
            for i, rr in enumerate(r["per_round"]):
                add(
                    f"  kill {i + 1}: to expiry / sweep lag / pickup lag (max s)",
                    f"{rr['kill_to_lease_expiry_s']['max']} / {rr['expiry_to_sweep_s']['max']} / "
                    f"{rr['sweep_to_reclaim_s']['max']}",
                )
        elif name == "sweep":
            for run in r["runs"]:
                tgt = run.get("target_ms")
                suffix = "" if run["variant"] == "as migrated" else f", {run['variant']}"
                label = f"sweep {run['expired']:,} expired of {r['rows']:,} rows{suffix}"
                if "timed_out_after_s" in run:
                    add(label, f"> {run['timed_out_after_s']:g} s (stopped)", "", False)
                    continue
                add(label, f"{run['wall_ms']} ms", f"< {tgt:g} ms" if tgt else "", run.get("met"))
                add("  next pass (nothing expired)", f"{run['next_pass_nothing_expired_ms']} ms")
        elif name == "heartbeat":
            a = r["as_migrated"]
            w = r["worker_renewer"]
            add(
                f"renew_leases {w['leases']} leases, runworker renewer (keeps expiry)",
                f"{w['renewals_per_s']:,} renewals/s, round p50 {w['round_ms']['p50']} ms, "
                f"HOT {w['hot_share']}",
            )
            add(
                f"renew_leases {a['leases']} leases, every renewal extends",
                f"{a['renewals_per_s']:,} renewals/s, round p50 {a['round_ms']['p50']} ms, "
                f"HOT {a['hot_share']}",
            )
            for label, w in r.get("what_if", {}).items():
                add(
                    f"  what-if {label}",
                    f"{w['renewals_per_s']:,} renewals/s, round p50 {w['round_ms']['p50']} ms, "
                    f"HOT {w['hot_share']}",
                )
    widths = [
        max(len(row[i]) for row in [*lines, ("metric", "value", "target", "")]) for i in range(4)
    ]
    out = []
    header = ("metric", "value", "target", "status")
    for row in [header, tuple("-" * w for w in widths), *lines]:
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return "\n".join(out)


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--items", type=_positive_int, help="M, items per drain (default 20000)")
    parser.add_argument("--workers", type=_int_list, help="worker process counts (default 1,2,4,8)")
    parser.add_argument("--quick", action="store_true", help="a smoke run with small sizes")
    parser.add_argument("--only", type=_scenario_list, help="comma-separated scenarios")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL,
        help="the PostgreSQL server to use (its database part is ignored)",
    )
    parser.add_argument(
        "--database", default="leasing_bench", help="database to (re)create (leasing_bench)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--json-out", type=Path, help="also write the JSON lines to this file")
    parser.add_argument(
        "--sweep-timeout",
        type=float,
        default=180.0,
        help="seconds a sweep pass may take before it is stopped (180)",
    )
    args = parser.parse_args(argv)
    if not args.database_url.startswith(("postgres://", "postgresql://", "pgsql://")):
        parser.error(f"the benchmarks need PostgreSQL, not {args.database_url!r}")
    return args


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected e.g. 1,2,4,8, got {text!r}") from None
    if not values or any(v <= 0 or v > 32 for v in values):
        raise argparse.ArgumentTypeError(f"worker counts must be 1..32, got {text!r}")
    return values


def _scenario_list(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    install_cleanup(bench.teardown)
    started = time.perf_counter()
    wanted = args.only or list(SCENARIOS)
    try:
        bench.setup()
        bench.run_scenario("machine", bench.machine)
        for name in SCENARIOS:
            if name in wanted:
                bench.run_scenario(name, getattr(bench, f"scenario_{name}"))
    finally:
        bench.teardown()
    elapsed = time.perf_counter() - started
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(
            "".join(json.dumps(r, default=str) + "\n" for r in bench.results.values())
        )
    print()
    print(table(bench.results))
    print(f"\n{len(bench.results) - 1} scenario(s) in {elapsed:.0f} s; logs in {bench.log_dir}")
    if bench.failed:
        print(f"FAILED: {', '.join(bench.failed)}", file=sys.stderr)
        return 1
    import shutil

    shutil.rmtree(bench.log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
