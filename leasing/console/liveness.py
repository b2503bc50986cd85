"""Is a process alive? Judged from its own `last_seen_at`, against its own interval.

A worker refreshes `last_seen_at` every heartbeat interval, a sweeper at
every pass. A process not seen for `SILENT_AFTER` of its own intervals is
silent: shown red with how long ("silent 2 min 31 s"), whatever its status
column says and whether or not a sweep is running to mark it lost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..conf import get_settings
from ..models import Worker, WorkerRole, WorkerStatus
from .durations import duration

SILENT_AFTER = 3  # intervals without a beat after which a process is silent
ALIVE_STATUSES = (WorkerStatus.RUNNING, WorkerStatus.STOPPING)


def beat_interval(process: Worker) -> float:
    """The seconds between two beats of `process`: its own interval.

    The one place that knows where the interval comes from. The `workers`
    table does not record it yet, so a worker is taken to beat every
    `LEASING["HEARTBEAT_INTERVAL"]`, and a sweeper at the interval its last
    pass reported, else at the average spacing of its passes, else every
    `LEASING["SWEEP_INTERVAL"]`. Once the table has `heartbeat_interval`,
    this becomes `return process.heartbeat_interval`.
    """
    conf = get_settings()
    if process.role != WorkerRole.SWEEPER:
        return conf.heartbeat_interval
    stats = process.last_scan_stats if isinstance(process.last_scan_stats, dict) else {}
    declared = _positive(stats.get("interval_seconds"))
    if declared:
        return declared
    if process.scans >= 2 and process.last_scan_at and process.started_at:
        spacing = (process.last_scan_at - process.started_at).total_seconds() / (process.scans - 1)
        if spacing > 0:
            return spacing
    return conf.sweep_interval


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


@dataclass(frozen=True, slots=True)
class Liveness:
    """How long a process has not been seen, measured against its own interval."""

    status: str
    seconds_since_seen: float
    interval_seconds: float

    @property
    def limit_seconds(self) -> float:
        return SILENT_AFTER * self.interval_seconds

    @property
    def silent(self) -> bool:
        """Supposed to be running, yet not seen for more than `SILENT_AFTER` intervals."""
        return self.status in ALIVE_STATUSES and self.seconds_since_seen > self.limit_seconds

    @property
    def alive(self) -> bool:
        return self.status in ALIVE_STATUSES and not self.silent

    @property
    def text(self) -> str:
        since = duration(self.seconds_since_seen)
        return f"silent {since}" if self.silent else f"seen {since} ago"


def liveness(process: Worker, seconds_since_seen: float) -> Liveness:
    return Liveness(
        status=process.status,
        seconds_since_seen=max(0.0, seconds_since_seen),
        interval_seconds=beat_interval(process),
    )
