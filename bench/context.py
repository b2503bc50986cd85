"""The benchmark context every scenario gets: its database, subprocesses and results."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from bench.common import (
    PYTHON,
    ROOT,
    BenchError,
    Processes,
    drop_database,
    emit,
    make_log_dir,
    progress,
    recreate_database,
    subprocess_env,
    with_database,
)
from bench.config import Sizes
from bench.measure import rnd
from leasing.sql.wakes import LISTENING

SUMMARY_LINE = re.compile(
    r"^worker (?P<worker_id>.+) stopped \((?P<reason>[^)]*)\): (?P<counts>claimed .+)$"
)


class Bench:
    """One run of the suite: its own database, its subprocesses and every scenario's record."""

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
        # Subprocesses get the project's default settings and logging; the
        # throughput scenario also runs them at WARNING to show what logging costs.
        self.env = subprocess_env(self.url)
        self.env_warning = subprocess_env(self.url, LEASING_LOG_LEVEL="WARNING")
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

    def xact_commits(self) -> int:
        """Committed transactions of this database so far (pg_stat_database), fresh."""
        self.sql("SELECT pg_stat_force_next_flush()")
        self.sql("SELECT pg_stat_clear_snapshot()")
        return int(
            self.one("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        )

    def listening(self) -> int:
        """Backends of this database that are a worker's listener (`LISTENING`)."""
        return self.one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            f"AND {LISTENING}"
        )

    # --- subprocesses -------------------------------------------------------------------------

    def leasing_env(self, env: dict[str, str] | None = None, **leasing: Any) -> dict[str, str]:
        """`env` (default: the bench's) giving the subprocess these LEASING keys."""
        env = dict(env or self.env)
        if leasing:
            env["LEASING_BENCH_SETTINGS"] = json.dumps(leasing)
        return env

    def runworker(
        self,
        *options: str,
        name: str = "runworker",
        env: dict[str, str] | None = None,
        leasing: dict[str, Any] | None = None,
    ) -> subprocess.Popen[bytes]:
        """A `runworker` process with these flags, and these LEASING keys (bench/settings.py)."""
        proc, _ = self.procs.spawn(
            [PYTHON, "manage.py", "runworker", *options],
            env=self.leasing_env(env, **(leasing or {})),
            name=name,
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
        """The summary line each runworker ended with (`worker ID stopped (REASON): claimed
        N, completed N, ...`), as a dict."""
        out = []
        for proc in procs:
            for line in reversed(self.procs.log_tail(proc, 10).splitlines()):
                if match := SUMMARY_LINE.match(line.strip()):
                    counts = (pair.rsplit(" ", 1) for pair in match["counts"].split(", "))
                    out.append(
                        {
                            "worker_id": match["worker_id"],
                            "reason": match["reason"],
                            **{key: int(value) for key, value in counts},
                        }
                    )
                    break
        return out

    # --- figures from the rows' own timestamps ------------------------------------------------

    def drain_stats(self, work_type: str = "bench.noop", since: Any = None) -> dict[str, Any]:
        """Figures of the items of `work_type` (created at or after `since`, if given)."""
        row = self.sql(
            """
            SELECT count(*) FILTER (WHERE status = 'completed'),
                   count(*),
                   count(*) FILTER (WHERE lease_token <> 1),
                   extract(epoch FROM max(completed_at) - min(started_at)),
                   percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
                       ORDER BY extract(epoch FROM started_at - created_at) * 1000),
                   percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
                       ORDER BY extract(epoch FROM completed_at - started_at) * 1000)
            FROM work_items WHERE work_type = %s AND (%s::timestamptz IS NULL OR created_at >= %s)
            """,
            [work_type, since, since],
        )[0]
        completed, total, reclaimed, span, e2s, s2c = row
        span = float(span or 0.0)
        return {
            "items": total,
            "completed": completed,
            "claimed_more_than_once": reclaimed,
            "span_s": round(span, 3),
            "jobs_per_s": round(completed / span, 1) if span > 0 else None,
            "enqueue_to_start_ms": {"p50": rnd(e2s and e2s[0]), "p99": rnd(e2s and e2s[1])},
            "start_to_complete_ms": {"p50": rnd(s2c and s2c[0]), "p99": rnd(s2c and s2c[1])},
        }

    # --- scenario plumbing --------------------------------------------------------------------

    def run_scenario(self, name: str, fn: Callable[[Bench], dict[str, Any]]) -> None:
        from django.db import close_old_connections

        # A connection a failed scenario left broken is replaced, not reused.
        close_old_connections()
        progress(f"scenario {name}")
        started = time.perf_counter()
        load_before = round(os.getloadavg()[0], 2)
        try:
            record = fn(self)
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
