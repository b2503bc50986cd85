"""Statements of the `workers` table: every worker and sweep process registers there.

A process inserts its row when it starts (or takes over the row of a stopped
or lost process with the same id), refreshes `last_seen_at` on every beat of
its own (`heartbeat_interval` seconds apart), and marks itself `stopped` on a
clean exit. A process not seen for `SILENT_INTERVALS` of its own intervals is
silent: the sweep marks it `lost`, and the console shows it red.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..states import WorkerRequest, WorkerRole, WorkerStatus
from .runner import Statement

if TYPE_CHECKING:
    from ..storage.base import Storage


SILENT_INTERVALS = 3
RUNNING = f"'{WorkerStatus.RUNNING.value}'"
STOPPING = f"'{WorkerStatus.STOPPING.value}'"
LOST = f"'{WorkerStatus.LOST.value}'"
STOP_REQUEST = f"'{WorkerRequest.STOP.value}'"


@dataclass(frozen=True, slots=True)
class RunReport:
    """What a worker's beat says of its runs (its `workers` row keeps the last one)."""

    busy: int = 0  # runs whose handler is running
    abandoned: int = 0  # fenced-out runs whose handler thread still runs
    newly_abandoned: int = 0  # runs abandoned since the last beat (added to the total)
    quiet: bool = False  # the process claims nothing


def silent(
    d: Storage,
    default_interval: float,
    row: str = "workers",
    *,
    sweeper_interval: float | None = None,
) -> Statement:
    """The row's process has not beaten for `SILENT_INTERVALS` of its own intervals.

    A row that recorded none is judged by `default_interval`, a sweeper's by
    `sweeper_interval` when given: its role's default, as the console judges it.
    """
    params: list[Any]
    if sweeper_interval is None:
        fallback, params = "%s", [default_interval]
    else:
        fallback = f"CASE WHEN {row}.role = %s THEN %s ELSE %s END"
        params = [WorkerRole.SWEEPER.value, sweeper_interval, default_interval]
    seconds = f"{SILENT_INTERVALS} * COALESCE({row}.heartbeat_interval, {fallback})"
    return d.older_than(f"{row}.last_seen_at", seconds), params


def register(
    d: Storage,
    *,
    worker_id: str,
    role: str,
    hostname: str,
    pid: int,
    concurrency: int,
    work_types_json: str,
    queues_json: str,
    heartbeat_interval: float,
) -> Statement:
    """Insert the process's row, or take over the row of a stopped, lost or silent one.

    Returns the id, or no row when a live process holds it.
    """
    live_check, live_params = silent(d, heartbeat_interval)
    values = (
        f"%s, %s, %s, %s, {d.now}, {d.now}, NULL, {RUNNING}, %s, "
        f"{d.json()}, {d.json()}, 0, 0, 0, 0, %s"
    )
    sql = f"""
        INSERT INTO workers (worker_id, role, hostname, pid, started_at, last_seen_at,
                             stopped_at, status, concurrency, work_types, queues,
                             items_completed, items_failed, scans, items_recovered,
                             heartbeat_interval)
        VALUES ({values})
        ON CONFLICT (worker_id) DO UPDATE SET
            role = excluded.role, hostname = excluded.hostname, pid = excluded.pid,
            started_at = excluded.started_at, last_seen_at = excluded.last_seen_at,
            stopped_at = NULL, status = {RUNNING}, concurrency = excluded.concurrency,
            work_types = excluded.work_types, queues = excluded.queues,
            heartbeat_interval = excluded.heartbeat_interval,
            runs_busy = 0, runs_abandoned = 0, quiet_since = NULL,
            requested_action = NULL, requested_by = NULL, request_reason = NULL,
            requested_at = NULL
        WHERE workers.status NOT IN ({RUNNING}, {STOPPING}) OR {live_check}
        RETURNING worker_id
    """
    params: list[Any] = [
        worker_id,
        role,
        hostname,
        pid,
        concurrency,
        work_types_json,
        queues_json,
        heartbeat_interval,
        *live_params,
    ]
    return sql, params


def beat(d: Storage, worker_id: str, completed: int, failed: int, runs: RunReport) -> Statement:
    """Refresh `last_seen_at`, add to the counters, record the runs, come back from `lost`.

    Returns the operator's request to the process, if any.
    """
    sql = f"""
        UPDATE workers
        SET last_seen_at = {d.now},
            items_completed = items_completed + %s, items_failed = items_failed + %s,
            runs_busy = %s, runs_abandoned = %s,
            runs_abandoned_total = runs_abandoned_total + %s,
            quiet_since = CASE WHEN %s THEN COALESCE(quiet_since, {d.now}) ELSE NULL END,
            status = CASE WHEN status = {LOST} THEN {RUNNING} ELSE status END
        WHERE worker_id = %s AND status IN ({RUNNING}, {STOPPING}, {LOST})
        RETURNING worker_id, requested_action, requested_by, request_reason
    """
    params = [
        completed,
        failed,
        runs.busy,
        runs.abandoned,
        runs.newly_abandoned,
        runs.quiet,
        worker_id,
    ]
    return sql, params


def request(d: Storage, worker_id: str, action: str, by: str, reason: str) -> Statement:
    """Ask a worker process to go quiet or stop (a lost one too: it may come back from a
    partition); a stop is never turned back into quiet."""
    sql = f"""
        UPDATE workers
        SET requested_action = %s, requested_by = %s, request_reason = %s,
            requested_at = {d.now}
        WHERE worker_id = %s AND role = %s AND status IN ({RUNNING}, {STOPPING}, {LOST})
          AND (requested_action IS NULL OR requested_action <> {STOP_REQUEST}
               OR %s = {STOP_REQUEST})
        RETURNING worker_id, requested_action
    """
    return sql, [action, by, reason, worker_id, WorkerRole.WORKER.value, action]


def record_scan(
    d: Storage, worker_id: str, stats_json: str, recovered: int, failed: int
) -> Statement:
    """A sweeper's pass: count it and keep its stats for the console."""
    sql = f"""
        UPDATE workers
        SET last_seen_at = {d.now}, last_scan_at = {d.now}, scans = scans + 1,
            items_recovered = items_recovered + %s, items_failed = items_failed + %s,
            last_scan_stats = {d.json()},
            status = CASE WHEN status = {LOST} THEN {RUNNING} ELSE status END
        WHERE worker_id = %s
        RETURNING worker_id
    """
    return sql, [recovered, failed, stats_json, worker_id]


def set_status(d: Storage, worker_id: str, status: str) -> Statement:
    """A process's own status change; `stopped` also stamps `stopped_at`."""
    stopped = f", stopped_at = {d.now}" if status == WorkerStatus.STOPPED else ""
    return (
        f"UPDATE workers SET status = %s, last_seen_at = {d.now}{stopped} WHERE worker_id = %s",
        [status, worker_id],
    )


def mark_lost(
    d: Storage, default_interval: float, sweeper_interval: float | None = None
) -> Statement:
    """Running or stopping processes that went silent become `lost`."""
    silent_sql, params = silent(d, default_interval, sweeper_interval=sweeper_interval)
    sql = f"""
        UPDATE workers SET status = {LOST}
        WHERE status IN ({RUNNING}, {STOPPING}) AND {silent_sql}
        RETURNING worker_id
    """
    return sql, params
