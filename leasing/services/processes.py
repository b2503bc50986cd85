"""Worker and sweep processes in the `workers` table: register, beat, record, stop.

A process registers when it starts. An id given by the operator
(`runworker --worker-id X`) may be reused once its previous process stopped,
was marked lost or went silent; a live process keeps its id and a second one
is refused with `ProcessIdInUse`.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import validation
from ..exceptions import InvalidInput, ProcessIdInUse
from ..sql import processes as sql
from ..sql.processes import SILENT_INTERVALS, RunReport
from ..sql.runner import dump_json, run, run_one
from ..states import WorkerRequest, WorkerRole, WorkerStatus
from ..storage import storage_for

logger = logging.getLogger("leasing.operations")


def new_process_id(role: str = WorkerRole.WORKER) -> str:
    """hostname:pid:random: unique per process start, readable in the console."""
    suffix = secrets.token_hex(3)
    prefix = "" if role == WorkerRole.WORKER else f"{role}@"
    return f"{prefix}{socket.gethostname()}:{os.getpid()}:{suffix}"


def register(
    worker_id: str,
    role: str = WorkerRole.WORKER,
    *,
    heartbeat_interval: float,
    concurrency: int = 1,
    work_types: Sequence[str] = (),
    queues: Sequence[str] = (),
    using: str = "default",
) -> None:
    """Insert the process's row (or take over a dead one's); `ProcessIdInUse` if it is live."""
    worker_id = validation.non_empty_text("worker_id", worker_id)
    statement = sql.register(
        storage_for(using),
        worker_id=worker_id,
        role=role,
        hostname=socket.gethostname()[: validation.MAX_KEY_LENGTH],
        pid=os.getpid(),
        concurrency=concurrency,
        work_types_json=dump_json(list(work_types)) or "[]",
        queues_json=dump_json(list(queues)) or "[]",
        heartbeat_interval=heartbeat_interval,
    )
    if run_one(using, statement) is None:
        raise ProcessIdInUse(
            f"worker id {worker_id!r} belongs to a process that is still running (seen within "
            f"{SILENT_INTERVALS} of its heartbeat intervals); stop it or choose another id."
        )


def beat(
    worker_id: str,
    *,
    completed: int = 0,
    failed: int = 0,
    runs: RunReport | None = None,
    using: str = "default",
) -> Beat | None:
    """Refresh `last_seen_at`, add to the counters and record the runs.

    Returns what the row says back (the operator's request), or None if the
    row is gone or stopped.
    """
    statement = sql.beat(storage_for(using), worker_id, completed, failed, runs or RunReport())
    row = run_one(using, statement)
    if row is None:
        return None
    return Beat(
        requested=row["requested_action"], by=row["requested_by"], reason=row["request_reason"]
    )


@dataclass(frozen=True, slots=True)
class Beat:
    """What a worker's beat reads back from its row."""

    requested: str | None  # WorkerRequest: quiet or stop, None: carry on
    by: str | None = None
    reason: str | None = None


def request(worker_id: Any, action: Any, *, by: Any, reason: Any, using: str = "default") -> bool:
    """Ask a live worker process to go quiet (stop claiming, finish its running items) or to
    stop (quiet, then exit as on SIGTERM). It sees the request at its next beat.

    Returns False when no running, stopping or lost worker has that id, or it
    was already asked to stop (a stop is not turned back into quiet). A lost
    one is asked too: a process cut off by a partition sees it when it comes
    back. `by` and `reason` are kept on the worker's row and logged.
    """
    using = validation.database_alias(using)
    worker_id = validation.non_empty_text("worker_id", worker_id)
    if action not in WorkerRequest.values:
        raise InvalidInput(
            f"Unknown request {action!r}; expected one of {', '.join(WorkerRequest.values)}."
        )
    by = validation.non_empty_text("by", by, max_length=150).strip()
    reason = validation.non_empty_text("reason", reason, max_length=1000).strip()
    row = run_one(using, sql.request(storage_for(using), worker_id, action, by, reason))
    if row is None:
        return False
    logger.warning("worker %s asked to %s by %s: %s", worker_id, action, by, reason)
    return True


def record_scan(
    worker_id: str, stats: dict[str, Any], *, recovered: int, failed: int, using: str = "default"
) -> bool:
    """A sweeper's pass: count it and keep its stats; False if the row is gone."""
    statement = sql.record_scan(
        storage_for(using), worker_id, dump_json(stats) or "{}", recovered, failed
    )
    return bool(run(using, statement))


def set_status(worker_id: str, status: str, *, using: str = "default") -> None:
    """Move a process's own row to running, stopping or stopped."""
    if status not in (WorkerStatus.STOPPING, WorkerStatus.STOPPED, WorkerStatus.RUNNING):
        raise ValueError(f"a process sets its own status to running/stopping/stopped, not {status}")
    run(using, sql.set_status(storage_for(using), worker_id, status))


def mark_lost(
    default_interval: float, *, sweeper_interval: float | None = None, using: str = "default"
) -> list[str]:
    """Mark processes silent for 3 of their own intervals `lost`; returns their ids.

    `default_interval` stands in for rows that recorded no interval of their own,
    `sweeper_interval` (when given) for such rows of sweepers.
    """
    rows = run(using, sql.mark_lost(storage_for(using), default_interval, sweeper_interval))
    return [row["worker_id"] for row in rows]
