"""Is a process alive? Judged from its own `last_seen_at`, against its own interval.

A worker refreshes `last_seen_at` every heartbeat interval, a sweeper at
every pass. A process not seen for `SILENT_AFTER` of its own intervals is
silent: shown red with how long ("silent 2 min 31 s"), whatever its status
column says and whether or not a sweep is running to mark it lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..conf import get_settings
from ..models import Worker, WorkerRole, WorkerStatus
from ..sql.processes import SILENT_INTERVALS
from .durations import duration

SILENT_AFTER = SILENT_INTERVALS  # the sweep marks a process lost after as many
ALIVE_STATUSES = (WorkerStatus.RUNNING, WorkerStatus.STOPPING)


def beat_interval(process: Worker) -> float:
    """The seconds between two beats of `process`: its own interval.

    Every process records it when it registers (`workers.heartbeat_interval`;
    a sweeper's is its pass interval). Rows registered before the column
    existed fall back to the configured interval of their role, as the sweep's
    `mark_lost` judges them (`sql.processes.silent`). A recorded
    interval of 0 (or less) is taken as recorded, as the sweep's `mark_lost`
    takes it (`sql.processes.silent`): such a process is silent as soon as it
    is not seen, never judged by another process's interval.
    """
    if process.heartbeat_interval is not None:
        return max(process.heartbeat_interval, 0.0)
    conf = get_settings()
    return conf.sweep_interval if process.role == WorkerRole.SWEEPER else conf.heartbeat_interval


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
