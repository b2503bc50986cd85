"""Helpers of bench/dashboard.py: the pages it times, the extra rows, the live workers.

* `load_extras`: idempotency keys, schedules and pauses, so that their lists
  are not timed empty (the work items and checkpoints come from dashboard.load),
  and what the console's newer panels show (`load_console_extras`).
* `console_pages`: every page and live-refresh fragment of the console, with
  the URLs derived from the admin itself (sortable columns, the deepest page).
* `Fleet`: 4 `runworker` processes (no --burst) and a trickle of demo work
  for them, and a beat that keeps the loaded 40 workers' rows and leases as
  they were loaded; started before the timed requests and always stopped afterwards.

`python -m bench.dashboard_pages trickle RATE` is the trickle process itself.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
TARGET_MEDIAN_MS = 300.0
TARGET_P95_MS = 500.0

# A tenth as many idempotency keys as work items, each pointing at an item;
# 40 schedules (half cron, half interval, none due during a run); 30 pauses
# of which one is active, on a work type no demo worker serves.
IDEMPOTENCY_SQL = """
INSERT INTO idempotency_keys (idempotency_key, task_id, work_item_id, request_hash,
                              response_data, status, created_at, completed_at, expires_at)
SELECT 'key-' || lpad(k::text, 10, '0'),
       'task-' || lpad(k::text, 6, '0'),
       'B' || lpad((k * 10)::text, 25, '0'),
       md5(k::text),
       CASE WHEN k %% 20 = 0 THEN NULL ELSE '{"ok": true}'::jsonb END,
       CASE WHEN k %% 20 = 0 THEN 'pending' WHEN k %% 50 = 1 THEN 'failed' ELSE 'completed' END,
       created,
       CASE WHEN k %% 20 = 0 THEN NULL ELSE created + interval '1 minute' END,
       created + interval '30 days'
FROM (
    SELECT k, statement_timestamp() - make_interval(secs => (%(keys)s - k) * 2592000.0 / %(keys)s)
           AS created
    FROM generate_series(1, %(keys)s) AS k
) AS keys
"""

SCHEDULES_SQL = """
INSERT INTO schedules (name, work_type, cron, every, timezone, payload, queue_name, missed,
                       enabled, from_settings, fingerprint, next_run_at, last_tick_at,
                       last_run_at, last_work_item_id, created_at, updated_at)
SELECT 'bench-schedule-' || lpad(s::text, 3, '0'), 'demo.sleep',
       CASE WHEN s % 2 = 0 THEN '0 3 * * *' ELSE '' END,
       CASE WHEN s % 2 = 0 THEN NULL ELSE 3600 * s END,
       'UTC', '{"seconds": 0.1}'::jsonb, 'default', 'skip', s % 5 <> 0, false, '',
       statement_timestamp() + interval '2 days', statement_timestamp() - interval '1 hour',
       statement_timestamp() - interval '1 hour', 'B' || lpad((s * 10)::text, 25, '0'),
       statement_timestamp() - interval '7 days', statement_timestamp() - interval '1 hour'
FROM generate_series(1, 40) AS s
"""

PAUSES_SQL = """
INSERT INTO leasing_pauses (kind, name, paused_by, reason, paused_at, resumed_by,
                            resume_reason, resumed_at)
SELECT CASE WHEN p % 2 = 0 THEN 'queue' ELSE 'work_type' END,
       CASE WHEN p % 2 = 0 THEN 'billing' ELSE 'sync_crm' END,
       'bench', 'bench pause ' || p, statement_timestamp() - make_interval(hours => p * 2),
       'bench', 'bench resume ' || p, statement_timestamp() - make_interval(hours => p * 2 - 1)
FROM generate_series(1, 29) AS p
UNION ALL
SELECT 'work_type', 'send_invoice', 'bench', 'bench: an active pause', statement_timestamp(),
       NULL, NULL, NULL
"""


# What the console's newer panels and filters read (bench/dashboard_settings.py turns the
# features on): media's pending items carry fairness keys (60 tenants, a third of the items
# on one), billing's carry rate keys (20 accounts) whose buckets are half closed; the item
# page the bench opens has a trace context; two of the 40 workers holding leases are not
# alive (one lost, one silent), so at-risk leases are listed and the status strip has them.
CONSOLE_SQL: tuple[tuple[str, str], ...] = (
    (
        "fair keys",
        """
UPDATE work_items
SET fairness_key = 'tenant-' || lpad((CASE WHEN substr(work_item_id, 2)::bigint % 3 = 0
                                      THEN 0 ELSE substr(work_item_id, 2)::bigint % 60 END)::text,
                                     2, '0')
WHERE status = 'pending' AND queue_name = 'media'
""",
    ),
    (
        "rate keys",
        """
UPDATE work_items SET rate_key = 'account-' || (substr(work_item_id, 2)::bigint % 20)
WHERE status = 'pending' AND queue_name = 'billing'
""",
    ),
    (
        "rate buckets",
        """
INSERT INTO leasing_rate_buckets (bucket, tat, next_at, admitted, window_start,
                                  window_admitted, previous_admitted, updated_at)
SELECT 'key:account-' || k, e + 1, CASE WHEN k % 2 = 0 THEN e + 30 ELSE e - 1 END,
       1000 * k, e - 5, 20, 90, statement_timestamp()
FROM generate_series(0, 19) AS k, (SELECT extract(epoch FROM statement_timestamp()) AS e) AS t
UNION ALL
SELECT 'queue:billing', e, e - 1, 50000, e - 5, 200, 480, statement_timestamp()
FROM (SELECT extract(epoch FROM statement_timestamp()) AS e) AS t
""",
    ),
    (
        "trace context",
        f"""
UPDATE work_items
SET trace_context = jsonb_build_object(
    'traceparent', '00-' || md5(work_item_id) || '-' || left(md5(task_id), 16) || '-01')
WHERE work_item_id = '{"B" + "50".rjust(25, "0")}'
""",
    ),
    (
        "dead holders",
        """
UPDATE workers
SET status = CASE WHEN worker_id = 'bench-worker-38' THEN 'lost' ELSE status END,
    last_seen_at = statement_timestamp() - CASE WHEN worker_id = 'bench-worker-38'
                                               THEN interval '3 minutes'
                                               ELSE interval '10 minutes' END
WHERE worker_id IN ('bench-worker-38', 'bench-worker-39')
""",
    ),
)


def load_console_extras() -> dict[str, float]:
    """`CONSOLE_SQL`, then what autovacuum would do after it; seconds per step."""
    from django.db import connection

    timings: dict[str, float] = {}
    with connection.cursor() as cursor:
        for name, sql in CONSOLE_SQL:
            started = time.perf_counter()
            cursor.execute(sql)
            timings[name] = time.perf_counter() - started
            print(f"  loaded {name:<12} in {timings[name]:6.1f} s", flush=True)
        started = time.perf_counter()
        cursor.execute("VACUUM (ANALYZE) work_items")
        cursor.execute("VACUUM (ANALYZE) workers")
        cursor.execute("VACUUM (ANALYZE) leasing_rate_buckets")
        timings["vacuum"] = time.perf_counter() - started
    return timings


def load_extras(rows: int) -> dict[str, float]:
    """Idempotency keys, schedules and pauses, then `load_console_extras`; seconds per step."""
    from django.db import connection

    timings: dict[str, float] = {}
    with connection.cursor() as cursor:
        steps: tuple[tuple[str, str, dict[str, int] | None], ...] = (
            ("idem. keys", IDEMPOTENCY_SQL, {"keys": max(100, rows // 10)}),
            ("schedules", SCHEDULES_SQL, None),  # no parameters: '%' is literal
            ("pauses", PAUSES_SQL, None),
        )
        for name, sql, params in steps:
            started = time.perf_counter()
            cursor.execute(sql, params)
            timings[name] = time.perf_counter() - started
            print(f"  loaded {name:<12} in {timings[name]:6.1f} s", flush=True)
        cursor.execute("VACUUM (ANALYZE) idempotency_keys")
        cursor.execute("VACUUM (ANALYZE) schedules")
        cursor.execute("VACUUM (ANALYZE) leasing_pauses")
    return {**timings, **load_console_extras()}


# --- the pages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    url: str
    fragment: bool = False  # sent with X-Leasing-Fragment, as leasing/console.js does
    target: bool = True  # counted for the exit status

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Leasing-Fragment": "1"} if self.fragment else {}


# Page(url, FRAGMENT): the request leasing/console.js sends to refresh a page in place.
FRAGMENT = True


def _changelist(user: Any, url: str) -> Any:
    """The work item list's ChangeList for `url`, as the admin builds it for `user`."""
    from django.contrib import admin
    from django.test import RequestFactory

    from leasing.models import WorkItem

    request = RequestFactory().get(url)
    request.user = user
    return admin.site._registry[WorkItem].get_changelist_instance(request)


def deepest_page(user: Any, changelist_url: str) -> int:
    """The last page number the unfiltered work item list accepts (?p=, 1-based)."""
    return _changelist(user, changelist_url).paginator.num_pages


def console_pages(user: Any) -> dict[str, Page]:
    """Every console page and live fragment; URLs from the admin's own URL names."""
    from datetime import timedelta

    from django.urls import reverse
    from django.utils.http import urlencode

    from leasing.admin.forms import WindowForm
    from leasing.console.failures import error_groups
    from leasing.sql.runner import database_now

    def admin_url(name: str, *args: str) -> str:
        return reverse(f"admin:{name}", args=args)

    dashboard = admin_url("leasing_workitem_dashboard")
    history = admin_url("leasing_workitem_history")
    errors = admin_url("leasing_workitem_errors")
    pauses = admin_url("leasing_workitem_pauses")
    items = admin_url("leasing_workitem_changelist")
    pages: dict[str, Page] = {
        "dashboard": Page(dashboard),
        "dashboard (refresh fragment)": Page(dashboard, FRAGMENT),
        "dashboard (7 d window)": Page(f"{dashboard}?window=10080"),
    }
    for minutes, label in WindowForm.WINDOWS.items():
        pages[f"history ({label})"] = Page(f"{history}?window={minutes}")
    pages["history (refresh fragment)"] = Page(history, FRAGMENT)
    # History narrowed to a queue, a work type, and both over a week.
    pages["history (queue=billing)"] = Page(f"{history}?queue=billing")
    pages["history (work_type=send_invoice)"] = Page(f"{history}?work_type=send_invoice")
    pages["history (queue and work_type, 7 d)"] = Page(
        f"{history}?{urlencode({'window': 10080, 'queue': 'media', 'work_type': 'resize_image'})}"
    )
    for minutes, label in WindowForm.WINDOWS.items():
        pages[f"top errors ({label})"] = Page(f"{errors}?window={minutes}")
    pages["top errors (final failures only)"] = Page(f"{errors}?final=1")
    since = database_now("default") - timedelta(minutes=WindowForm.DEFAULT_WINDOW)
    groups, _ = error_groups(since)
    if groups:
        query = urlencode({"key": groups[0].key, "window": WindowForm.DEFAULT_WINDOW})
        pages["top errors: retry-group confirmation"] = Page(
            f"{admin_url('leasing_workitem_errors_retry')}?{query}"
        )
    pages["pauses"] = Page(pauses)
    pages["pauses: confirmation form"] = Page(
        f"{pauses}?{urlencode({'action': 'pause', 'kind': 'queue', 'name': 'media'})}"
    )
    pages["work items (all)"] = Page(items)
    pages["work items (live refresh)"] = Page(items, FRAGMENT)
    for health in ("healthy", "stale", "at_risk", "expired", "no_progress"):
        pages[f"work items (lease_health={health})"] = Page(f"{items}?lease_health={health}")
    for status in ("pending", "in_progress", "completed", "failed"):
        pages[f"work items (status={status})"] = Page(f"{items}?status__exact={status}")
    pages["work items (retrying=yes)"] = Page(f"{items}?retrying=yes")
    pages["work items (queue_name=media)"] = Page(f"{items}?queue_name=media")
    # The fair queues panel's link: one tenant's unblocked pending items.
    pages["work items (a fairness key's pending)"] = Page(
        f"{items}?{urlencode({'queue_name': 'media', 'fairness_key': 'tenant-00'})}"
        "&status__exact=pending&dependencies_left=0"
    )
    # The search in payloads (the bench's inputs have 1,000 customers): a thousandth of the
    # rows, and a value no row has, through the GIN index of migration 0015.
    pages["work items (payload search: input customer)"] = Page(f"{items}?input__customer=c42")
    # A number: matches 500000 and "500000" (one row).
    pages["work items (payload search: number)"] = Page(f"{items}?input__n=500000")
    pages["work items (payload search: no match)"] = Page(
        f"{items}?{urlencode({'payload': 'customer=nobody', 'payload_in': 'input'})}"
    )
    cl = _changelist(user, items)
    for column in cl.sortable_by:
        index = cl.list_display.index(column)
        pages[f"work items sorted by {column} asc"] = Page(f"{items}?o={index}")
        pages[f"work items sorted by {column} desc"] = Page(f"{items}?o=-{index}")
    # Filled in just before it is timed (the estimate grows with the trickle).
    pages["work items (deepest page)"] = Page(f"{items}?p=DEEPEST")
    # A page past the last offered one (a bookmark, an edited URL): served as the last.
    pages["work items (page 20,000 asked)"] = Page(f"{items}?p=20000")
    # A failed item with a trace context (its trace link) and its error text.
    pages["work item change page (trace id)"] = Page(
        admin_url("leasing_workitem_change", "B" + "50".rjust(25, "0"))
    )
    pages["checkpoint timeline"] = Page(admin_url("leasing_workitem_timeline", "task-000001"))
    pages["checkpoint list"] = Page(admin_url("leasing_checkpoint_changelist"))
    pages["worker list"] = Page(admin_url("leasing_worker_changelist"))
    pages["worker page"] = Page(admin_url("leasing_worker_change", "bench-worker-1"))
    pages["worker page (lost, holding leases)"] = Page(
        admin_url("leasing_worker_change", "bench-worker-38")
    )
    pages["idempotency key list"] = Page(admin_url("leasing_idempotencykey_changelist"))
    pages["schedules list"] = Page(admin_url("leasing_schedule_changelist"))
    return pages


def measure(
    client: Any, url: str, runs: int, warmup: int, headers: dict[str, str]
) -> dict[str, float]:
    """Median and p95 of `runs` requests after `warmup` untimed ones."""
    for _ in range(warmup):
        response = client.get(url, headers=headers)
        if response.status_code != 200:
            raise SystemExit(f"GET {url} answered {response.status_code}")
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url, headers=headers)
        samples.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"GET {url} answered {response.status_code}")
    samples.sort()
    p95_index = max(0, round(0.95 * len(samples)) - 1)
    return {
        "median_ms": round(statistics.median(samples), 1),
        "p95_ms": round(samples[p95_index], 1),
        "min_ms": round(samples[0], 1),
        "max_ms": round(samples[-1], 1),
        "bytes": len(response.content),
    }


def met(result: dict[str, float]) -> bool:
    return result["median_ms"] < TARGET_MEDIAN_MS and result["p95_ms"] < TARGET_P95_MS


# --- the workers and their work -------------------------------------------------------------

# One enqueue every 1/RATE s, cycling through: 16 of 20 demo.flaky that succeed at once, one
# that fails once (a retry after the backoff), one that fails for good (top errors), and two
# demo.sleep of 0.3 s that hold a heartbeating lease.
TRICKLE_CYCLE: tuple[tuple[str, dict[str, Any]], ...] = (
    *(("demo.flaky", {"fail_times": 0}),) * 16,
    ("demo.flaky", {"fail_times": 1}),
    ("demo.flaky", {"permanent": True}),
    *(("demo.sleep", {"seconds": 0.3}),) * 2,
)


# The 40 loaded workers and the 2 sweepers stand for a live fleet: without a beat they would
# all read as silent minutes into the run (every lease at risk, the sweep dead), which is
# not the site the targets are about. Every BEAT_SECONDS their rows are seen again and
# their leases move forward by the time elapsed, so each lease keeps its loaded health
# (healthy, stale, expired, no progress); bench-worker-38 (lost) and -39 (silent) stay dead.
# The leases move every LEASE_BEAT_SECONDS, as a heartbeat at a fraction of a long lease
# would (well within the staleness threshold), not on every beat: each move rewrites the
# 2,000 rows and the table pages around them.
BEAT_SECONDS = 5.0
LEASE_BEAT_SECONDS = 30.0
LIVE_HOLDERS = [f"bench-worker-{w}" for w in range(38)]
ALL_HOLDERS = [f"bench-worker-{w}" for w in range(40)]
BEAT_WORKERS_SQL = """
UPDATE workers
SET last_seen_at = statement_timestamp() - interval '4 seconds',
    last_scan_at = CASE WHEN role = 'sweeper'
                        THEN statement_timestamp() - interval '20 seconds' END
WHERE worker_id = ANY(%s) OR worker_id IN ('sweeper@host-1', 'sweeper@host-2')
"""
BEAT_LEASES_SQL = """
UPDATE work_items
SET lease_acquired_at = lease_acquired_at + %(d)s, lease_expires_at = lease_expires_at + %(d)s,
    heartbeat_at = heartbeat_at + %(d)s, progress_at = progress_at + %(d)s
WHERE status = 'in_progress' AND lease_holder = ANY(%(holders)s)
"""


def beat() -> None:
    """Keep the loaded fleet alive (`BEAT_WORKERS_SQL`, `BEAT_LEASES_SQL`) until SIGTERM."""
    import django

    django.setup()
    from django.db import connection

    stop = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        last = cursor.fetchone()[0]
        while not stop:
            time.sleep(BEAT_SECONDS)
            cursor.execute(BEAT_WORKERS_SQL, [LIVE_HOLDERS])
            cursor.execute("SELECT statement_timestamp()")
            now = cursor.fetchone()[0]
            if (now - last).total_seconds() >= LEASE_BEAT_SECONDS:
                cursor.execute(BEAT_LEASES_SQL, {"d": now - last, "holders": ALL_HOLDERS})
                last = now


def trickle(rate: float) -> None:
    """Enqueue demo work at `rate` items a second until SIGTERM (run as its own process)."""
    import django

    django.setup()
    from leasing import enqueue

    stop = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    period = 1.0 / rate
    sent = 0
    started = time.monotonic()
    while not stop:
        work_type, data = TRICKLE_CYCLE[sent % len(TRICKLE_CYCLE)]
        enqueue(f"trickle-{sent // 100:06d}", work_type, data, max_retries=2)
        sent += 1
        time.sleep(max(0.0, started + sent * period - time.monotonic()))
    print(sent, flush=True)


@dataclass
class Fleet:
    """`workers` runworker processes and a trickle of `rate` items/s on the bench database."""

    workers: int
    rate: float
    logs: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    files: list[TextIO] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.dashboard_settings",
            "LEASING_LOG_LEVEL": "WARNING",
        }

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.logs / f"{name}.log", "w")  # noqa: SIM115 - closed in stop()
        self.files.append(log)
        self.processes.append(
            subprocess.Popen(argv, cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        )

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        for n in range(self.workers):
            self._spawn(f"worker-{n}", [sys.executable, "manage.py", "runworker"])
        if self.rate > 0:
            argv = [sys.executable, "-m", "bench.dashboard_pages", "trickle", str(self.rate)]
            self._spawn("trickle", argv)
        self._spawn("beat", [sys.executable, "-m", "bench.dashboard_pages", "beat"])
        self.wait_registered()

    def wait_registered(self, timeout: float = 60.0) -> None:
        """Until every worker has its row in `workers` (it claims from then on)."""
        from django.db import connection

        deadline = time.monotonic() + timeout
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM workers WHERE role = 'worker' AND status = 'running'"
                    " AND worker_id NOT LIKE 'bench-%'"
                )
                running = cursor.fetchone()[0]
            if running >= self.workers:
                return
            dead = [p.args for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise SystemExit(
                    f"{running} of {self.workers} workers registered; exited: {dead}; "
                    f"see {self.logs}"
                )
            time.sleep(0.5)

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.processes[: self.workers])

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a graceful stop), then SIGKILL whatever is left after `timeout`."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self.files:
            log.close()


def flow(since_sql: str = "statement_timestamp() - interval '1 day'") -> dict[str, int]:
    """Demo items by status: what the workers did during the run."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT status, count(*) FROM work_items WHERE work_type LIKE 'demo.%' "
            f"AND created_at > {since_sql} GROUP BY status ORDER BY status"
        )
        return dict(cursor.fetchall())


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "trickle":
        trickle(float(sys.argv[2]))
    elif sys.argv[1:] == ["beat"]:
        beat()
    else:
        sys.exit("usage: python -m bench.dashboard_pages trickle RATE | beat")
