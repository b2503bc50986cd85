"""Every figure of the dashboard page, computed against one database clock reading."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..sql.runner import database_now
from ..states import WorkItemStatus
from .backlog import Backlog, Throughput, active_pauses, backlog, pending_pairs, throughput
from .census import FINISHED, RetryDistribution, StatusCounts, status_counts
from .fairness import FairQueue, fair_queue_table
from .finished import finished_for, is_rolled
from .leases import LeaseHealthSummary, lease_health
from .processes import (
    HolderLeases,
    ProcessInfo,
    SweepHealth,
    live_holder_ids,
    live_workers,
    sweep_health,
)
from .queues import QueueRow, queue_table
from .rates import WAITING_CAP, RateRow, rate_table
from .replica import ReplicaLag, replica_lag
from .retrying import retrying_count
from .timeline import CheckpointEntry, recent_recoveries


@dataclass(frozen=True, slots=True)
class Dashboard:
    now: datetime
    lease_health: LeaseHealthSummary
    backlog: Backlog
    statuses: StatusCounts
    retries: RetryDistribution  # items finished in the window
    throughput: Throughput
    queues: tuple[QueueRow, ...]
    sweep: SweepHealth
    workers: tuple[ProcessInfo, ...]
    orphan_holders: tuple[HolderLeases, ...]
    recoveries: tuple[CheckpointEntry, ...]
    # How far the read database is behind the primary; None: the console reads the primary.
    replica: ReplicaLag | None = None
    # Rate limits' buckets (LEASING RATE_LIMITS, an enqueue's rate_limit).
    rate_limits: tuple[RateRow, ...] = ()
    # Fair queues' keys with claimable items (LEASING FAIR_QUEUES); empty when none is set.
    fair_queues: tuple[FairQueue, ...] = ()
    # A day or a week: the window's finished figures start on this hour, and
    # its run-time percentiles are read from histograms.
    rolled_from: datetime | None = None
    # Items failing but still retrying (`console.retrying`), and whether the count was capped.
    retrying: int = 0
    retrying_capped: bool = False
    pauses: frozenset[tuple[str, str]] = frozenset()  # active: {(kind, name)}


def build_dashboard(
    *,
    include_payloads: bool = False,
    window_minutes: int = 60,
    recoveries: int = 10,
    using: str = "default",
    primary: str = "default",
) -> Dashboard:
    """Compute every figure of the dashboard (indexed queries, each bounded).

    Items by status: pending from the backlog, in progress from lease
    health, completed and failed exactly while small, else estimated
    (`census.status_counts`). Every figure of the items finished in the
    window (throughput, retries, the queue table's counts and run times)
    comes from one grouped read (`console.finished`): no figure reads the
    whole history, and a day or a week reads the hourly rollup.

    Every figure is read from `using`; when that is not `primary` (a read
    replica), the page also says how far behind the primary it is.
    """
    # Measured first: the figures below are at least this old.
    replica = replica_lag(using, primary=primary) if using != primary else None
    now = database_now(using)
    workers, orphans = live_workers(now=now, using=using)
    health = lease_health(using=using, holders=live_holder_ids(workers))
    pairs = pending_pairs(using=using)  # read once: the backlog and the queue table
    pauses = active_pauses(using=using)
    pending = backlog(now=now, using=using, pairs=pairs, pauses=pauses)
    window = finished_for(window_minutes=window_minutes, now=now, using=using)
    totals = status_counts((*FINISHED, WorkItemStatus.CANCELLED), using=using)
    statuses = StatusCounts(
        pending=pending.pending,
        in_progress=health.active,
        completed=totals["completed"][0],
        failed=totals["failed"][0],
        cancelled=totals["cancelled"][0],
        estimated=frozenset(s for s, (_, estimated) in totals.items() if estimated),
    )
    retrying, retrying_capped = retrying_count(using=using)
    return Dashboard(
        now=now,
        retrying=retrying,
        retrying_capped=retrying_capped,
        pauses=pauses,
        lease_health=health,
        backlog=pending,
        statuses=statuses,
        retries=window.retries(),
        throughput=throughput(window_minutes=window_minutes, now=now, using=using, finished=window),
        queues=queue_table(
            window_start=window.start,
            now=now,
            workers=workers,
            using=using,
            pending=pairs,
            finished=window,
            pauses=pauses,
        ),
        sweep=sweep_health(now=now, using=using),
        workers=workers,
        orphan_holders=orphans,
        recoveries=recent_recoveries(
            limit=recoveries, include_payloads=include_payloads, using=using
        ),
        replica=replica,
        rolled_from=window.start if is_rolled(window_minutes) else None,
        rate_limits=rate_table(using=using, pending=pairs, waiting_cap=WAITING_CAP, now=now),
        fair_queues=fair_queue_table(now=now, using=using),
    )
