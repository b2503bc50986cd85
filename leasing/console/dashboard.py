"""Every figure of the dashboard page, computed against one database clock reading."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ..sql.runner import database_now
from .backlog import Backlog, Throughput, backlog, throughput
from .census import RetryDistribution, StatusCounts, cached_retry_distribution
from .leases import LeaseHealthSummary, lease_health
from .processes import HolderLeases, ProcessInfo, SweepHealth, live_workers, sweep_health
from .queues import QueueRow, queue_table
from .replica import ReplicaLag, replica_lag
from .timeline import CheckpointEntry, recent_recoveries


@dataclass(frozen=True, slots=True)
class Dashboard:
    now: datetime
    lease_health: LeaseHealthSummary
    backlog: Backlog
    statuses: StatusCounts
    retries: RetryDistribution
    retries_as_of: datetime | None  # None: computed for this page
    throughput: Throughput
    queues: tuple[QueueRow, ...]
    sweep: SweepHealth
    workers: tuple[ProcessInfo, ...]
    orphan_holders: tuple[HolderLeases, ...]
    recoveries: tuple[CheckpointEntry, ...]
    payloads_included: bool
    # How far the read database is behind the primary; None: the console reads the primary.
    replica: ReplicaLag | None = None


def build_dashboard(
    *,
    include_payloads: bool = False,
    window_minutes: int = 60,
    recoveries: int = 10,
    using: str = "default",
    primary: str = "default",
) -> Dashboard:
    """Compute every figure of the dashboard (twelve indexed queries).

    Items by status are assembled from queries the page needs anyway: pending
    from the backlog, in progress from lease health, completed and failed
    from the retry distribution (the only query whose cost grows with the
    table, see `census.RETRY_CACHE_SECONDS`).

    Every figure is read from `using`; when that is not `primary` (a read
    replica), the page also says how far behind the primary it is.
    """
    # Measured first: the figures below are at least this old.
    replica = replica_lag(using, primary=primary) if using != primary else None
    now = database_now(using)
    workers, orphans = live_workers(now=now, using=using)
    health = lease_health(using=using)
    pending = backlog(now=now, using=using)
    retries, retries_as_of = cached_retry_distribution(now=now, using=using)
    statuses = StatusCounts(
        pending=pending.pending,
        in_progress=health.active,
        completed=retries.completed,
        failed=retries.failed,
    )
    return Dashboard(
        now=now,
        lease_health=health,
        backlog=pending,
        statuses=statuses,
        retries=retries,
        retries_as_of=retries_as_of,
        throughput=throughput(window_minutes=window_minutes, now=now, using=using),
        queues=queue_table(
            window_start=now - timedelta(minutes=window_minutes),
            now=now,
            workers=workers,
            using=using,
        ),
        sweep=sweep_health(now=now, using=using),
        workers=workers,
        orphan_holders=orphans,
        recoveries=recent_recoveries(
            limit=recoveries, include_payloads=include_payloads, using=using
        ),
        payloads_included=include_payloads,
        replica=replica,
    )
