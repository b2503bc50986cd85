"""Prometheus metrics of the leasing tables, computed from the database at scrape time.

`LeasingCollector` runs a handful of indexed queries (through
`leasing.console`) on every scrape, so every process serving the endpoint
reports the same numbers: the truth is the database, not a process's memory.
It is registered in its own `CollectorRegistry`, never in prometheus_client's
global one, so importing the app adds nothing to another exporter.

Metrics (all prefixed `leasing_`):

=====================================  =======  =================================================
`work_items{status}`                   gauge    items in each status (exact): pending,
                                                in_progress, completed, failed
`active_leases`                        gauge    in-progress items (the first monitoring query)
`stale_leases`                         gauge    in-progress items whose heartbeat is older than
                                                STALE_HEARTBEAT (second column of that query)
`leases{health}`                       gauge    in-progress items by lease health:
                                                healthy / stale / expired (awaiting sweep)
`leases_without_progress`              gauge    healthy leases whose handler has not beaten
                                                for STALE_HEARTBEAT
`pending_deferred`                     gauge    pending items waiting for their run_after
`oldest_pending_age_seconds`           gauge    age of the oldest claimable pending item (0: none)
`claims_total`                         counter  SUM(work_items.lease_token): every claim adds 1
                                                and nothing subtracts
`completions_total`                    counter  items in status completed (terminal: no action
                                                takes an item out of it)
`failures_total`                       counter  SUM(workers.items_failed): failures counted by
                                                workers and items failed by the sweep
`recoveries_total`                     counter  SUM(workers.items_recovered) of sweepers: expired
                                                leases re-queued by the sweep
`sweep_scans_total`                    counter  SUM(workers.scans) of sweepers
`sweep_last_scan_timestamp_seconds`    gauge    when any sweep last scanned (absent: never)
`sweep_last_scan_age_seconds`          gauge    seconds since that pass, on the database clock
                                                (absent: never)
`sweep_running`                        gauge    sweep processes running and alive, as the
                                                console judges them (one-off passes: not
                                                processes, not counted)
`sweep_last_scan_errors`               gauge    errors the last pass of the sweep the console
                                                judges by recorded (0: none, or no pass)
`expired_lease_age_seconds`            gauge    how long the longest-expired in-progress lease
                                                has waited for the sweep (0: none expired)
`processes{role,status}`               gauge    rows of the workers table
`worker_runs{state}`                   gauge    runs of running and stopping workers as of
                                                their last beat: busy (a handler runs) and
                                                abandoned (fenced out, its thread still runs)
`abandoned_runs_total`                 counter  SUM(workers.runs_abandoned_total): runs workers
                                                abandoned since their rows were created
`processes_silent{role}`               gauge    running processes not seen for three of their
                                                own beat intervals
`queue_pending{queue,work_type}`       gauge    pending items per queue and work type
`queue_in_flight{queue,work_type}`     gauge    in-progress items per queue and work type
`queue_unserved{queue,work_type}`      gauge    1 when items are pending and no live worker
                                                claims that work type from that queue (a
                                                quiet or stopping one, or one past
                                                MAX_ABANDONED_RUNS, claims nothing; not
                                                when paused)
`queue_paused{queue,work_type}`        gauge    1 when the queue or the work type is paused
`items_blocked{queue}`                 gauge    pending items of the queue waiting for their
                                                dependencies (counted in `queue_pending`)
`run_seconds{work_type,quantile}`      gauge    run time of the last attempt of items completed
                                                in the last hour: p50 and p95 (from a log-scale
                                                histogram: within 6%)
`leases_near_cap`                      gauge    live leases within 5 minutes of their hard cap
`rate_limit_per_second{bucket}`        gauge    a rate limit's items per second (LEASING
                                                RATE_LIMITS, an enqueue's rate_limit)
`rate_admitted_total{bucket}`          counter  items its bucket admitted
`rate_per_second{bucket}`              gauge    items it admitted per second, last 10 s
`rate_closed{bucket}`                  gauge    1 while it admits nothing (its items wait)
`rate_waiting{bucket}`                 gauge    pending items of its queue, type or rate key
`read_replica_lag_seconds`             gauge    with LEASING["READ_DATABASE"] on a replica: how
                                                old its data is (0: everything replayed)
`read_replica_lag_bytes`               gauge    WAL the replica has not replayed yet
`read_replica_replay_paused`           gauge    1 while its replay is paused
=====================================  =======  =================================================

With `LEASING["READ_DATABASE"]` set, every figure is read from that database
(a replica's figures are as old as `read_replica_lag_seconds`); the
`read_replica_*` gauges are absent otherwise, and when the alias is not a
PostgreSQL replica.

The counters are monotonic as long as rows are not deleted from `work_items`
(`claims_total`, `completions_total`) or `workers` (the others); a deletion
looks like a counter reset, which `rate()` and `increase()` handle. They are
not reset by a process restart, because they are not kept in a process.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from .console.backlog import backlog, pending_pairs
from .console.census import item_census
from .console.history import leases_near_cap
from .console.leases import lease_health
from .console.processes import (
    ProcessInfo,
    live_workers,
    process_counters,
    processes_by_state,
    records_passes,
    sweep_health,
)
from .console.queues import QueueRow, queue_table
from .console.rates import rate_table
from .console.replica import replica_lag
from .models import LeaseHealth, WorkerRole, WorkerStatus
from .sql.runner import database_now

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# What `LeasingCollector._families` builds: both kinds take `add_metric(labels, value)`.
type _Family = GaugeMetricFamily | CounterMetricFamily

PREFIX = "leasing"
QUEUE_LABELS = ["queue", "work_type"]
RUN_TIME_WINDOW = timedelta(hours=1)

MISSING_CLIENT = (
    "The leasing metrics need the prometheus-client package, which is not installed: "
    "pip install 'django-leasing[metrics]'."
)


class MetricsUnavailable(ImproperlyConfigured):
    """prometheus-client is an optional dependency (the `metrics` extra) and is missing."""


def _client() -> ModuleType:
    # Imported on first use, never with the app: prometheus-client is an extra.
    try:
        import prometheus_client.core
    except ImportError as exc:
        raise MetricsUnavailable(MISSING_CLIENT) from exc
    return prometheus_client


class LeasingCollector:
    """Reads the leasing tables of database `using` at every `collect()`.

    A prometheus_client collector by its methods (the registry only calls
    `collect()` and `describe()`), so defining it needs no import of the client.
    """

    def __init__(self, using: str = "default", primary: str = "default") -> None:
        self.using = using
        self.primary = primary

    def describe(self) -> Iterable[Metric]:
        # Declared without values, so registering the collector runs no query.
        return list(self._families().values())

    def collect(self) -> Iterator[Metric]:
        using = self.using
        lag = replica_lag(using, primary=self.primary) if using != self.primary else None
        census = item_census(using=using)
        health = lease_health(using=using)
        pairs = pending_pairs(using=using)  # read once: the backlog and the queue table
        pending = backlog(using=using, pairs=pairs)
        now = database_now(using)
        sweep = sweep_health(now=now, using=using)
        counters = process_counters(using=using)
        processes = processes_by_state(using=using)
        workers, _ = live_workers(now=now, using=using)
        queues = queue_table(
            window_start=now - RUN_TIME_WINDOW, now=now, workers=workers, using=using, pending=pairs
        )

        families = self._families()
        work_items = families["work_items"]
        for status, count in census.statuses.as_dict().items():
            work_items.add_metric([status], count)
        families["active_leases"].add_metric([], health.active)
        families["stale_leases"].add_metric([], health.stale)
        leases = families["leases"]
        leases.add_metric([LeaseHealth.HEALTHY], health.healthy)
        leases.add_metric([LeaseHealth.STALE], health.stale_live)
        leases.add_metric(["at_risk"], health.at_risk)
        leases.add_metric([LeaseHealth.EXPIRED], health.expired)
        families["leases_without_progress"].add_metric([], health.no_progress)
        families["pending_deferred"].add_metric([], pending.deferred)
        families["oldest_pending_age_seconds"].add_metric([], pending.oldest_age_seconds or 0.0)
        families["claims"].add_metric([], census.claims_total)
        families["completions"].add_metric([], census.statuses.completed)
        families["failures"].add_metric([], counters.items_failed)
        families["recoveries"].add_metric([], counters.items_recovered)
        families["sweep_scans"].add_metric([], counters.scans)
        if sweep.last_scan_at is not None:
            families["sweep_last_scan_timestamp_seconds"].add_metric(
                [], sweep.last_scan_at.timestamp()
            )
        if sweep.seconds_since_last_scan is not None:
            families["sweep_last_scan_age_seconds"].add_metric([], sweep.seconds_since_last_scan)
        families["sweep_running"].add_metric([], len(_running_sweeps(sweep.sweepers)))
        families["sweep_last_scan_errors"].add_metric([], sweep.last_pass_errors)
        families["expired_lease_age_seconds"].add_metric([], sweep.oldest_expired_seconds or 0.0)
        for role in WorkerRole.values:
            for status in WorkerStatus.values:
                families["processes"].add_metric([role, status], processes.get((role, status), 0))
        families["worker_runs"].add_metric(["busy"], sum(w.runs_busy for w in workers))
        families["worker_runs"].add_metric(["abandoned"], sum(w.runs_abandoned for w in workers))
        families["abandoned_runs"].add_metric([], counters.runs_abandoned)
        silent = Counter(p.role for p in (*workers, *sweep.sweepers) if p.liveness.silent)
        for role in WorkerRole.values:
            families["processes_silent"].add_metric([role], silent[role])
        for row in queues:
            labels = [row.queue_name, row.work_type]
            families["queue_pending"].add_metric(labels, row.pending)
            families["queue_in_flight"].add_metric(labels, row.in_flight)
            families["queue_unserved"].add_metric(labels, int(row.unserved))
            families["queue_paused"].add_metric(labels, int(row.paused))
        # The pairs read once above count the blocked items: no query of its own.
        blocked: Counter[str] = Counter()
        for pair in pairs:
            blocked[pair.queue_name] += pair.blocked
        for queue_name, count in blocked.items():
            families["items_blocked"].add_metric([queue_name], count)
        for work_type, quantiles in _run_seconds(queues).items():
            for quantile, seconds in quantiles.items():
                families["run_seconds"].add_metric([work_type, quantile], seconds)
        families["leases_near_cap"].add_metric([], leases_near_cap(using=using))
        for rate in rate_table(using=using):
            if rate.limit_per_second is not None:
                families["rate_limit_per_second"].add_metric([rate.bucket], rate.limit_per_second)
            families["rate_admitted"].add_metric([rate.bucket], rate.admitted)
            families["rate_per_second"].add_metric([rate.bucket], rate.per_second)
            families["rate_closed"].add_metric([rate.bucket], int(rate.closed))
            families["rate_waiting"].add_metric([rate.bucket], rate.waiting)
        if lag is not None and lag.is_replica:
            if lag.seconds is not None:
                families["read_replica_lag_seconds"].add_metric([], lag.seconds)
            if lag.bytes is not None:
                families["read_replica_lag_bytes"].add_metric([], lag.bytes)
            families["read_replica_replay_paused"].add_metric([], int(lag.paused))
        yield from families.values()

    @staticmethod
    def _families() -> dict[str, _Family]:
        _client()  # MetricsUnavailable when prometheus-client is missing
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        def gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        def counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels or [])

        return {
            "work_items": gauge("work_items", "Work items by status.", ["status"]),
            "active_leases": gauge("active_leases", "Work items in progress (leased)."),
            "stale_leases": gauge(
                "stale_leases",
                "In-progress work items whose heartbeat is older than their type's stale "
                "threshold (three heartbeat periods, at most STALE_HEARTBEAT).",
            ),
            "leases": gauge(
                "leases",
                "In-progress work items by lease health (healthy, stale, at_risk: held by a "
                "silent or lost worker, expired awaiting sweep).",
                ["health"],
            ),
            "leases_without_progress": gauge(
                "leases_without_progress",
                "Healthy leases whose handler has not shown progress for STALE_HEARTBEAT.",
            ),
            "pending_deferred": gauge(
                "pending_deferred", "Pending work items waiting for their run_after."
            ),
            "oldest_pending_age_seconds": gauge(
                "oldest_pending_age_seconds",
                "Age of the oldest claimable pending work item, 0 when none is waiting.",
            ),
            "claims": counter("claims", "Leases granted (sum of the fencing tokens)."),
            "completions": counter("completions", "Work items completed."),
            "failures": counter(
                "failures", "Work item failures counted by workers and the recovery sweep."
            ),
            "recoveries": counter("recoveries", "Expired leases re-queued by the recovery sweep."),
            "sweep_scans": counter("sweep_scans", "Passes of the recovery sweep."),
            "worker_runs": gauge(
                "worker_runs",
                "Runs of live workers as of their last beat: busy (handler running) and "
                "abandoned (fenced out, handler thread still running).",
                ["state"],
            ),
            "abandoned_runs": counter(
                "abandoned_runs",
                "Runs workers abandoned: fenced out (timed out, lease lost) while their handler "
                "thread still ran.",
            ),
            "sweep_last_scan_timestamp_seconds": gauge(
                "sweep_last_scan_timestamp_seconds",
                "Unix time of the newest recovery sweep pass (absent when none ever ran).",
            ),
            "sweep_last_scan_age_seconds": gauge(
                "sweep_last_scan_age_seconds",
                "Seconds since the newest recovery sweep pass, on the database clock (absent "
                "when none ever ran).",
            ),
            "sweep_running": gauge(
                "sweep_running",
                "Recovery sweep processes running and alive (seen within three of their pass "
                "intervals); one-off passes (--once, django-q2) are not counted.",
            ),
            "sweep_last_scan_errors": gauge(
                "sweep_last_scan_errors",
                "Errors recorded by the last pass of the recovery sweep the console judges by "
                "(a step failed); 0 when none, or no pass.",
            ),
            "expired_lease_age_seconds": gauge(
                "expired_lease_age_seconds",
                "Seconds the longest-expired in-progress lease has waited for the recovery sweep "
                "(database clock); 0 when no lease is expired.",
            ),
            "processes": gauge(
                "processes", "Rows of the workers table by role and status.", ["role", "status"]
            ),
            "processes_silent": gauge(
                "processes_silent",
                "Running processes not seen for three of their own beat intervals.",
                ["role"],
            ),
            "queue_pending": gauge(
                "queue_pending", "Pending work items by queue and work type.", QUEUE_LABELS
            ),
            "queue_in_flight": gauge(
                "queue_in_flight", "In-progress work items by queue and work type.", QUEUE_LABELS
            ),
            "queue_unserved": gauge(
                "queue_unserved",
                "1 when items of this queue and work type are pending and no live worker claims "
                "them (quiet and stopping workers, and those past MAX_ABANDONED_RUNS, claim "
                "nothing).",
                QUEUE_LABELS,
            ),
            "queue_paused": gauge(
                "queue_paused",
                "1 when this queue or this work type is paused (leasing.pause()).",
                QUEUE_LABELS,
            ),
            "items_blocked": gauge(
                "items_blocked",
                "Pending work items of this queue waiting for their dependencies (counted in "
                "queue_pending).",
                ["queue"],
            ),
            "run_seconds": gauge(
                "run_seconds",
                "Run time of the last attempt of items completed in the last hour.",
                ["work_type", "quantile"],
            ),
            "leases_near_cap": gauge(
                "leases_near_cap", "Live leases within 5 minutes of their hard cap."
            ),
            "rate_limit_per_second": gauge(
                "rate_limit_per_second", "A rate limit's items per second.", ["bucket"]
            ),
            "rate_admitted": counter(
                "rate_admitted", "Items a rate limit's bucket admitted.", ["bucket"]
            ),
            "rate_per_second": gauge(
                "rate_per_second",
                "Items a rate limit's bucket admitted per second over the last 10 seconds.",
                ["bucket"],
            ),
            "rate_closed": gauge(
                "rate_closed",
                "1 while a rate limit's bucket admits nothing (its pending items wait).",
                ["bucket"],
            ),
            "rate_waiting": gauge(
                "rate_waiting",
                "Pending items of a rate limit's queue, work type or rate key.",
                ["bucket"],
            ),
            "read_replica_lag_seconds": gauge(
                "read_replica_lag_seconds",
                "How old the data of the read replica (READ_DATABASE) is; 0 when it has "
                "replayed everything the primary wrote.",
            ),
            "read_replica_lag_bytes": gauge(
                "read_replica_lag_bytes",
                "WAL bytes the read replica (READ_DATABASE) has not replayed yet.",
            ),
            "read_replica_replay_paused": gauge(
                "read_replica_replay_paused", "1 while the read replica's replay is paused."
            ),
        }


def _running_sweeps(sweepers: Iterable[ProcessInfo]) -> list[ProcessInfo]:
    """The sweep processes running and alive, by the liveness the console shows for each
    (`console.liveness`); a row of one-off passes is no process (`records_passes`)."""
    return [s for s in sweepers if s.liveness.alive and not records_passes(s)]


def _run_seconds(queues: Iterable[QueueRow]) -> dict[str, dict[str, float]]:
    """The slowest queue's p50/p95 for each work type (a type can run in several queues)."""
    result: dict[str, dict[str, float]] = {}
    for row in queues:
        if row.p50_seconds is None or row.p95_seconds is None:
            continue
        best = result.setdefault(row.work_type, {"0.5": 0.0, "0.95": 0.0})
        best["0.5"] = max(best["0.5"], row.p50_seconds)
        best["0.95"] = max(best["0.95"], row.p95_seconds)
    return result


def build_registry(using: str = "default") -> CollectorRegistry:
    """A private registry holding only the leasing collector.

    Raises `MetricsUnavailable` when prometheus-client is not installed.
    """
    _client()  # MetricsUnavailable when prometheus-client is missing
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(LeasingCollector(using))
    return registry


_registries: dict[str, CollectorRegistry] = {}


def get_registry(using: str = "default") -> CollectorRegistry:
    """The registry the metrics view serves (one per database alias, created once)."""
    registry = _registries.get(using)
    if registry is None:
        registry = _registries.setdefault(using, build_registry(using))
    return registry


def render_latest(using: str = "default") -> tuple[bytes, str]:
    """The exposition text and its content type (`MetricsUnavailable` without the client)."""
    client = _client()
    return client.generate_latest(get_registry(using)), client.CONTENT_TYPE_LATEST


def answer_when_unavailable(
    view: Callable[..., HttpResponse],
) -> Callable[..., HttpResponse]:
    """Wrap the metrics view: a missing prometheus-client is a 503 saying what to install.

    The view checks access first and renders last, so only a caller allowed to
    scrape ever sees this answer.
    """

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except MetricsUnavailable as exc:
            return HttpResponse(f"{exc}\n", status=503, content_type="text/plain; charset=utf-8")

    return wrapper


__all__ = [
    "MISSING_CLIENT",
    "LeasingCollector",
    "MetricsUnavailable",
    "answer_when_unavailable",
    "build_registry",
    "get_registry",
    "render_latest",
]
