"""Benchmark: every page of the leasing admin console at scale, with live workers.

    .venv/bin/python bench/dashboard.py                 # 1,000,000 work items, 50,000 checkpoints
    .venv/bin/python bench/dashboard.py --rows 20000    # a quick smoke run
    .venv/bin/python bench/dashboard.py --database h_x --load-only   # load once, then
    .venv/bin/python bench/dashboard.py --database h_x --reuse       # time pages again

It creates its own PostgreSQL database (`leasing_bench_dashboard`, or --database, on the server
of DATABASE_URL, default postgres://postgres@127.0.0.1:5432/test; dropped first
if it exists), migrates it, loads work items in realistic statuses plus
checkpoints, workers, a sweeper, idempotency keys, schedules and pauses with
INSERT ... SELECT generate_series, VACUUM ANALYZEs, rolls the finished hours up
(as a running sweep keeps them rolled up), then starts 4 `runworker`
processes (no --burst) and a trickle of demo work for them (`--rate` items/s
of demo.flaky and demo.sleep), and renders each page with Django's test Client
as a superuser: a warm-up, then `--runs` timed requests. The workers and the
trickle are stopped (SIGTERM) at the end, whatever happens; the run fails if
the workers completed none of the trickle (the figures would then be those of
an idle site).

The settings are bench/dashboard_settings.py (the project's with a fair queue,
rate limits and a trace URL), so the dashboard renders every panel: the status
strip (a paused work type, at-risk leases of a lost and a silent worker), the
tiles, the workers panel with 40 registered workers, the fair queues and rate
limits panels.

The pages (bench/dashboard_pages.py): the dashboard, its refresh fragment (the
request leasing/console.js sends, with X-Leasing-Fragment) and its 7 d window;
history in each window, its fragment and narrowed to a queue and/or work type;
top errors in each window, final failures only, and a retry-group
confirmation; the pauses page and its confirmation form; the work item list
unfiltered, as its live refresh, filtered by every lease health (at risk
too), status, retrying, a queue and a fairness key, searched in payloads (a
text, a number, no match), sorted by every sortable column both ways, and at
its deepest page; a work item page with a trace id, a checkpoint timeline, and
the checkpoint, worker, idempotency key and schedule lists and two worker
pages (a live one, a lost one holding leases).

Every figure is computed by its request: the console caches nothing. The
target of each page: median < 300 ms and p95 < 500 ms; the exit status is 1 if a page
misses it. It prints a table and one JSON line per page.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "leasing_bench_dashboard"
WORKERS = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="work items (default 1,000,000)"
    )
    parser.add_argument(
        "--checkpoints",
        type=int,
        default=None,
        help="checkpoints (default rows / 20, i.e. 50,000 for a million rows)",
    )
    parser.add_argument("--runs", type=int, default=15, help="timed requests per page")
    parser.add_argument("--warmup", type=int, default=3, help="untimed requests per page")
    parser.add_argument(
        "--rate", type=float, default=10.0, help="demo items enqueued a second (0: workers idle)"
    )
    parser.add_argument("--database", default=BENCH_DB, help=f"database name ({BENCH_DB})")
    parser.add_argument(
        "--keep", action="store_true", help="keep the database afterwards (default: drop it)"
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="time the pages against a database a --load-only run kept (no reload; kept)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="time only the pages whose name contains this text (with --reuse, to re-check some)",
    )
    parser.add_argument(
        "--load-only",
        action="store_true",
        help="load the database, keep it and stop (to profile pages against it)",
    )
    args = parser.parse_args(argv)
    if args.load_only or args.reuse:
        args.keep = True
    if args.load_only and args.reuse:
        parser.error("--load-only and --reuse exclude each other")
    if args.rows < 1000:
        parser.error("--rows must be at least 1000")
    if args.rate < 0:
        parser.error("--rate must be non-negative")
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be positive and --warmup non-negative")
    if args.checkpoints is None:
        args.checkpoints = max(1000, args.rows // 20)
    return args


def server_url(database: str) -> tuple[str, str]:
    """(URL of the bench database, URL of the server's maintenance database)."""
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
    parts = urlsplit(base)
    if parts.scheme not in ("postgres", "postgresql"):
        sys.exit(f"bench/dashboard.py needs a PostgreSQL DATABASE_URL, got {parts.scheme!r}.")
    bench = urlunsplit((parts.scheme, parts.netloc, "/" + quote(database), "", ""))
    maintenance = urlunsplit(("postgresql", parts.netloc, "/postgres", "", ""))
    return bench, maintenance


def recreate_database(maintenance_url: str, database: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(maintenance_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def drop_database(maintenance_url: str, database: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(maintenance_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )


# The shape of the data, per million rows: 90 % completed (3 % of them in the
# last hour), 2 % failed, 7.8 % pending (a ninth of them deferred by a retry
# backoff), 0.2 % in progress: healthy, stale, expired and stuck leases held
# by 40 workers. Task ids group ten items each; checkpoints come in runs of 100
# per task (the default retention), every type represented.
WORK_ITEMS_SQL = """
WITH params AS (
    SELECT %(rows)s::bigint AS n,
           %(rows)s::bigint - (%(rows)s::bigint * 8 / 100) AS pending_from,
           GREATEST(%(rows)s::bigint * 3 / 100, 1) AS recent
), g AS (
    SELECT s AS g, p.n, p.pending_from, p.recent,
           statement_timestamp() - make_interval(secs => (p.n - s) * 2592000.0 / p.n) AS created
    FROM params p, generate_series(1, (SELECT n FROM params)) AS s
), shaped AS (
    SELECT g.*,
        CASE
            WHEN g >= pending_from AND g %% 40 = 0 THEN 'in_progress'
            WHEN g >= pending_from THEN 'pending'
            WHEN g %% 50 = 0 THEN 'failed'
            ELSE 'completed'
        END AS status,
        (g / 40) %% 20 AS lease_kind
    FROM g
)
INSERT INTO work_items (
    work_item_id, task_id, work_type, status, priority, lease_holder, lease_token,
    lease_acquired_at, lease_expires_at, lease_deadline_at, heartbeat_at, progress_at,
    retry_count, max_retries, run_after, queue_name, input_data, output_data, error_message,
    created_at, started_at, completed_at, updated_at
)
SELECT
    'B' || lpad(g::text, 25, '0'),
    'task-' || lpad((g / 10)::text, 6, '0'),
    (ARRAY['send_invoice', 'resize_image', 'sync_crm', 'build_report', 'llm_agent'])[1 + g %% 5],
    status,
    CASE WHEN g %% 7 = 0 THEN 5 ELSE 0 END,
    CASE WHEN status = 'in_progress' THEN 'bench-worker-' || ((g / 40) %% 40) END,
    retry + CASE WHEN status = 'pending' THEN 0 ELSE 1 END,
    CASE WHEN status = 'in_progress' THEN statement_timestamp() - interval '10 minutes' END,
    CASE WHEN status <> 'in_progress' THEN NULL
         WHEN lease_kind < 2 THEN statement_timestamp() - interval '30 seconds'
         WHEN lease_kind < 5 THEN statement_timestamp() + interval '10 minutes'
         ELSE statement_timestamp() + interval '15 minutes' END,
    CASE WHEN status = 'in_progress' THEN statement_timestamp() + interval '4 hours' END,
    CASE WHEN status <> 'in_progress' THEN NULL
         WHEN lease_kind < 2 THEN statement_timestamp() - interval '330 seconds'
         WHEN lease_kind < 5 THEN statement_timestamp() - interval '200 seconds'
         ELSE statement_timestamp() - interval '10 seconds' END,
    CASE WHEN status = 'in_progress' AND lease_kind > 5
         THEN statement_timestamp() - interval '5 seconds' END,
    retry,
    3,
    CASE WHEN status = 'pending' AND g %% 9 = 0
         THEN statement_timestamp() + interval '30 minutes' END,
    (ARRAY['default', 'default', 'billing', 'media'])[1 + g %% 4],
    jsonb_build_object('n', g, 'customer', 'c' || (g %% 1000), 'note', 'bench payload'),
    CASE WHEN status = 'completed' THEN '{"ok": true}'::jsonb END,
    CASE WHEN status = 'failed' AND retry = 0 THEN 'PermanentError: rejected'
         WHEN status = 'failed' THEN 'Max retries exceeded'
         WHEN status = 'pending' AND g %% 9 = 0 THEN 'Lease expired - retry 1/3' END,
    created,
    CASE WHEN status = 'pending' THEN NULL ELSE created + interval '1 second' END,
    finished,
    COALESCE(finished, statement_timestamp())
FROM (
    SELECT shaped.*,
        CASE
            WHEN status = 'completed' THEN
                CASE WHEN g %% 100 < 85 THEN 0 WHEN g %% 100 < 95 THEN 1
                     WHEN g %% 100 < 99 THEN 2 ELSE 3 END
            WHEN status = 'failed' THEN CASE WHEN g %% 3 = 0 THEN 0 ELSE 3 END
            WHEN status = 'pending' AND g %% 9 = 0 THEN 1
            ELSE 0
        END AS retry,
        CASE
            WHEN status NOT IN ('completed', 'failed') THEN NULL
            WHEN g >= pending_from - recent
                THEN statement_timestamp()
                     - make_interval(secs => (pending_from - g) * 3600.0 / recent)
            ELSE created + interval '40 seconds'
        END AS finished
    FROM shaped
) AS rows
"""

CHECKPOINTS_SQL = """
INSERT INTO checkpoints (
    checkpoint_id, task_id, work_item_id, checkpoint_type, sequence_number,
    snapshot_data, metadata, created_at
)
SELECT
    'C' || lpad(t::text, 12, '0') || lpad(seq::text, 13, '0'),
    'task-' || lpad(t::text, 6, '0'),
    'B' || lpad((t * 10)::text, 25, '0'),
    (ARRAY['iteration_start', 'llm_response', 'tool_executed', 'iteration_end',
           'approval_point', 'manual_checkpoint', 'state_transition',
           'error_boundary'])[1 + (seq - 1) %% 8],
    seq,
    jsonb_build_object('step', seq, 'state', repeat('x', 40), 'done', seq %% 8 = 4),
    jsonb_build_object('source', 'bench'),
    statement_timestamp() - make_interval(secs => (%(tasks)s - t) * 60 + (100 - seq) * 0.5)
FROM generate_series(1, %(tasks)s) AS t, generate_series(1, 100) AS seq
"""

WORKERS_SQL = """
INSERT INTO workers (worker_id, role, hostname, pid, started_at, last_seen_at, status,
                     concurrency, work_types, queues, items_completed, items_failed,
                     scans, items_recovered, last_scan_at, last_scan_stats)
SELECT 'bench-worker-' || w, 'worker', 'host-' || (w % 8), 1000 + w,
       statement_timestamp() - interval '2 hours', statement_timestamp() - interval '4 seconds',
       'running', 50,
       '["send_invoice", "resize_image", "sync_crm", "build_report", "llm_agent"]'::jsonb,
       '["default", "billing", "media"]'::jsonb, 20000 + w, 300 + w, 0, 0,
       NULL::timestamptz, NULL::jsonb
FROM generate_series(0, 39) AS w
UNION ALL
SELECT 'bench-old-' || w, 'worker', 'host-old', 500 + w,
       statement_timestamp() - interval '3 days', statement_timestamp() - interval '1 day',
       'stopped', 10, '[]'::jsonb, '[]'::jsonb, 5000, 50, 0, 0, NULL, NULL
FROM generate_series(1, 5) AS w
UNION ALL
SELECT 'sweeper@host-' || s, 'sweeper', 'host-' || s, 900 + s,
       statement_timestamp() - interval '2 hours', statement_timestamp() - interval '20 seconds',
       'running', 1, '[]'::jsonb, '[]'::jsonb, 0, 40, 120, 900,
       statement_timestamp() - interval '20 seconds',
       '{"expired_found": 3, "recovered": 3, "failed": 0, "scan_duration_ms": 12.5}'::jsonb
FROM generate_series(1, 2) AS s
"""


def load(rows: int, checkpoints: int) -> dict[str, float]:
    """Fill the bench database; return seconds per step."""
    from django.db import connection

    timings: dict[str, float] = {}
    tasks = max(1, checkpoints // 100)
    with connection.cursor() as cursor:
        steps: tuple[tuple[str, str, dict[str, int] | None], ...] = (
            ("work items", WORK_ITEMS_SQL, {"rows": rows}),
            ("checkpoints", CHECKPOINTS_SQL, {"tasks": tasks}),
            ("workers", WORKERS_SQL, None),  # no parameters: '%' is literal
        )
        for name, sql, params in steps:
            started = time.perf_counter()
            cursor.execute(sql, params)
            timings[name] = time.perf_counter() - started
            print(f"  loaded {name:<12} in {timings[name]:6.1f} s", flush=True)
        started = time.perf_counter()
        # What autovacuum does on a live system: statistics for the planner and
        # a visibility map, so that the counting queries can be index-only.
        cursor.execute("VACUUM (ANALYZE) work_items")
        cursor.execute("VACUUM (ANALYZE) checkpoints")
        cursor.execute("VACUUM (ANALYZE) workers")
        timings["vacuum analyze"] = time.perf_counter() - started
        print(f"  vacuum analyze       in {timings['vacuum analyze']:6.1f} s", flush=True)
    # A running sweep keeps the console's hourly rollup current; a new one
    # reaches back 8 days, as here (one call instead of four passes).
    from leasing.services.rollups import roll_up_finished_hours

    started = time.perf_counter()
    rolled = roll_up_finished_hours(max_hours=24 * 9)
    timings["hourly rollup"] = time.perf_counter() - started
    print(
        f"  rolled up {rolled.hours} hours ({rolled.rows:,} rows) "
        f"in {timings['hourly rollup']:6.1f} s",
        flush=True,
    )
    return timings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench_url, maintenance_url = server_url(args.database)
    if not args.reuse:
        print(f"Creating database {args.database!r} ...", flush=True)
        recreate_database(maintenance_url, args.database)

    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = bench_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.dashboard_settings"
    os.environ.setdefault("LEASING_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from bench.dashboard_pages import (
        TARGET_MEDIAN_MS,
        TARGET_P95_MS,
        Fleet,
        Page,
        console_pages,
        deepest_page,
        flow,
        load_extras,
        measure,
        met,
    )

    fleet = Fleet(WORKERS, args.rate, ROOT / "artifacts" / "bench-dashboard-logs")
    try:
        if not args.reuse:
            call_command("migrate", verbosity=0, interactive=False)
            print(f"Loading {args.rows:,} work items and {args.checkpoints:,} checkpoints ...")
            load(args.rows, args.checkpoints)
            load_extras(args.rows)
        if args.load_only:
            print(f"Loaded; the database {args.database!r} is kept.")
            return 0

        # The test Client's host; no setup_test_environment(), whose template
        # instrumentation would add to the figures.
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
        users = get_user_model().objects
        user = users.filter(username="bench").first() or users.create_superuser(
            "bench", "bench@example.com", "bench"
        )
        client = Client()
        client.force_login(user)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM work_items")
            total = cursor.fetchone()[0]
            cursor.execute("SELECT count(*) FROM checkpoints")
            checkpoints = cursor.fetchone()[0]

        print(f"Starting {WORKERS} runworker processes and a trickle of {args.rate:g} items/s ...")
        fleet.start()
        time.sleep(3)  # the first items flow before the first request
        pages = {n: p for n, p in console_pages(user).items() if args.only in n}
        work = (
            f"{WORKERS} runworker processes; a trickle of {args.rate:g} demo items/s"
            if args.rate > 0
            else f"{WORKERS} runworker processes, idle (polling)"
        )
        print(
            f"\n{total:,} work items, {checkpoints:,} checkpoints; {work}; "
            f"{args.warmup} warm-up + {args.runs} timed requests per page; "
            "no cache\n",
            flush=True,
        )
        load_before = os.getloadavg()[0]
        results: dict[str, dict[str, float]] = {}
        for name, page in pages.items():
            if "DEEPEST" in page.url:
                deepest = deepest_page(user, page.url.split("?")[0])
                page = pages[name] = Page(page.url.replace("DEEPEST", str(deepest)))
            results[name] = measure(client, page.url, args.runs, args.warmup, page.headers)
            print(f"  {name:<44} {results[name]['median_ms']:>8.1f} ms", flush=True)
        load_after = os.getloadavg()[0]
        alive = fleet.alive()
        done = flow()

        width = max(len(name) for name in results)
        print(
            f"\n{'page':<{width}} {'median ms':>10} {'p95 ms':>8} {'min ms':>8} {'max ms':>8}  "
            "target"
        )
        for name, r in results.items():
            target = f"<{TARGET_MEDIAN_MS:.0f}/<{TARGET_P95_MS:.0f}"
            verdict = ("met" if met(r) else "MISSED") if pages[name].target else "(context)"
            print(
                f"{name:<{width}} {r['median_ms']:>10.1f} {r['p95_ms']:>8.1f} "
                f"{r['min_ms']:>8.1f} {r['max_ms']:>8.1f}  {target} {verdict}"
            )
        print(
            f"\n{os.cpu_count()} CPUs; load average {load_before:.2f} before, "
            f"{load_after:.2f} after (other processes on the machine slow every figure); "
            f"{alive} of {WORKERS} workers still running at the end; demo items by status: "
            f"{done}\n"
        )
        for name, r in results.items():
            print(
                json.dumps(
                    {
                        "bench": "dashboard",
                        "page": name,
                        "url": pages[name].url,
                        "fragment": pages[name].fragment,
                        "rows": total,
                        "checkpoints": checkpoints,
                        "runs": args.runs,
                        "workers": WORKERS,
                        "trickle_per_s": args.rate,
                        "uncached": True,
                        "loadavg": round(load_before, 2),
                        **r,
                        "target_median_ms": TARGET_MEDIAN_MS if pages[name].target else None,
                        "target_p95_ms": TARGET_P95_MS if pages[name].target else None,
                        "met": met(r) if pages[name].target else None,
                    }
                )
            )
        missed = [n for n, r in results.items() if pages[n].target and not met(r)]
        if missed:
            print(f"\nMISSED: {', '.join(missed)}", file=sys.stderr)
        if args.rate > 0 and not done.get("completed"):
            print(f"\nThe workers completed none of the trickle: {done}", file=sys.stderr)
            return 1
        return 1 if missed else 0
    finally:
        fleet.stop()
        connection.close()
        if not args.keep:
            drop_database(maintenance_url, args.database)


if __name__ == "__main__":
    sys.exit(main())
