"""The `workers` table (SPEC §3.4): every worker and sweep process registers here.

A process inserts its row when it starts, refreshes `last_seen_at` (its own
heartbeat, on the database clock) while it runs, and marks itself `stopped`
on a clean exit. The recovery sweep marks rows not seen for two scan
intervals `lost`; a lost process that comes back sets itself `running` again
on its next beat.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Sequence
from typing import Any

from .db import Dialect, dump_json, execute, translate_db_errors
from .models import WorkerRole, WorkerStatus


def new_worker_id(role: str = WorkerRole.WORKER) -> str:
    """hostname:pid:random — unique per process start, readable in the dashboard."""
    suffix = secrets.token_hex(3)
    prefix = "" if role == WorkerRole.WORKER else f"{role}@"
    return f"{prefix}{socket.gethostname()}:{os.getpid()}:{suffix}"


def register(
    worker_id: str,
    role: str = WorkerRole.WORKER,
    *,
    concurrency: int = 1,
    work_types: Sequence[str] = (),
    queues: Sequence[str] = (),
    using: str = "default",
) -> None:
    d = Dialect(using)
    execute(
        using,
        f"""
        INSERT INTO workers (worker_id, role, hostname, pid, started_at, last_seen_at, status,
                             concurrency, work_types, queues, items_completed, items_failed,
                             scans, items_recovered)
        VALUES (%s, %s, %s, %s, {d.now}, {d.now}, 'running', %s,
                {d.json_param()}, {d.json_param()}, 0, 0, 0, 0)
        """,
        [
            worker_id,
            role,
            socket.gethostname(),
            os.getpid(),
            concurrency,
            dump_json(list(work_types)),
            dump_json(list(queues)),
        ],
    )


def beat(
    worker_id: str,
    *,
    completed: int = 0,
    failed: int = 0,
    using: str = "default",
) -> bool:
    """Refresh `last_seen_at` and add to the counters; False if the row is gone."""
    d = Dialect(using)
    rows = execute(
        using,
        f"""
        UPDATE workers
        SET last_seen_at = {d.now},
            items_completed = items_completed + %s,
            items_failed = items_failed + %s,
            status = CASE WHEN status = 'lost' THEN 'running' ELSE status END
        WHERE worker_id = %s AND status <> 'stopped'
        RETURNING worker_id
        """,
        [completed, failed, worker_id],
    )
    return bool(rows)


def record_scan(
    worker_id: str,
    stats: dict[str, Any],
    *,
    recovered: int,
    failed: int,
    using: str = "default",
) -> None:
    """A sweeper's pass: count it and keep its stats for the dashboard."""
    d = Dialect(using)
    execute(
        using,
        f"""
        UPDATE workers
        SET last_seen_at = {d.now}, last_scan_at = {d.now}, scans = scans + 1,
            items_recovered = items_recovered + %s, items_failed = items_failed + %s,
            last_scan_stats = {d.json_param()},
            status = CASE WHEN status = 'lost' THEN 'running' ELSE status END
        WHERE worker_id = %s
        """,
        [recovered, failed, dump_json(stats), worker_id],
    )


def set_status(worker_id: str, status: str, *, using: str = "default") -> None:
    """Move a process's row to `stopping` or `stopped` (the latter stamps `stopped_at`)."""
    if status not in (WorkerStatus.STOPPING, WorkerStatus.STOPPED, WorkerStatus.RUNNING):
        raise ValueError(f"a process sets its own status to running/stopping/stopped, not {status}")
    d = Dialect(using)
    stopped = f", stopped_at = {d.now}" if status == WorkerStatus.STOPPED else ""
    with translate_db_errors():
        execute(
            using,
            f"UPDATE workers SET status = %s, last_seen_at = {d.now}{stopped} WHERE worker_id = %s",
            [status, worker_id],
        )


def mark_lost(not_seen_seconds: float, *, using: str = "default") -> list[str]:
    """Mark running/stopping processes not seen for `not_seen_seconds` as lost."""
    d = Dialect(using)
    rows = execute(
        using,
        f"""
        UPDATE workers SET status = 'lost'
        WHERE status IN ('running', 'stopping') AND last_seen_at < {d.now_minus()}
        RETURNING worker_id
        """,
        [d.seconds(not_seen_seconds, sign=-1)],
    )
    return [r["worker_id"] for r in rows]
