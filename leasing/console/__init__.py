"""Read-only queries behind the operator console: the admin dashboard, the checkpoint
timeline and the `/metrics` collector.

Nothing here writes. Each function returns frozen dataclasses, so a template
cannot trigger a query by walking a relation, and each query is shaped for an
index so the pages stay fast on tables of millions of rows:

* `leases`: in-progress items by lease health (the `in_progress` partial index),
  each type judged by its own heartbeat and each lease by its holder's liveness;
* `retrying`: items failing but still retrying (pending with `retry_count > 0`);
* `census`: items by status, the retry distribution and the claims counter
  (index-only scans of `work_items_status_retry_idx` and the in-flight index);
* `backlog`: the pending backlog (`work_items_claim_idx`) and throughput over
  time (`work_items_completed_idx`);
* `processes`: workers and sweepers, their liveness and the leases they hold;
* `timeline`: checkpoints of a task and the newest `error_boundary` ones;
* `choices`: work types and queues offered by the list filters;
* `charts`, `tiles` and `strip`: the inline SVG charts, the tiles and the status strip;
* `dashboard`: every figure of the dashboard page against one clock reading;
* `replica`: how far the read database (`LEASING["READ_DATABASE"]`) is behind;
* `unreachable`: which database a page could not read, and the driver's reason.

Every function reads the alias its caller passes (`using`); the views pass
`leasing.conf.read_alias()`, so with a read replica configured the whole
console reads from it.

Times are compared with the database clock. Payloads (`input_data`,
`output_data`, checkpoint `snapshot_data` and `metadata`) are loaded only when
a caller passes `include_payloads=True`, which the views do only for users
with the `leasing.view_payload` permission.
"""

from .backlog import Backlog, Throughput, ThroughputBucket, backlog, throughput
from .census import (
    ItemCensus,
    RetryBucket,
    RetryDistribution,
    StatusCounts,
    item_census,
    retry_distribution,
    status_count,
)
from .choices import known_queues, known_work_types
from .dashboard import Dashboard, build_dashboard
from .durations import humanize_seconds
from .leases import LeaseHealthSummary, lease_health
from .processes import (
    HolderLeases,
    ProcessCounters,
    ProcessInfo,
    SweepHealth,
    live_workers,
    process_counters,
    processes_by_state,
    sweep_health,
)
from .replica import ReplicaLag, replica_lag
from .timeline import CheckpointEntry, TaskItem, Timeline, recent_recoveries, task_timeline
from .windows import THROUGHPUT_WINDOWS

__all__ = [
    "THROUGHPUT_WINDOWS",
    "Backlog",
    "CheckpointEntry",
    "Dashboard",
    "HolderLeases",
    "ItemCensus",
    "LeaseHealthSummary",
    "ProcessCounters",
    "ProcessInfo",
    "ReplicaLag",
    "RetryBucket",
    "RetryDistribution",
    "StatusCounts",
    "SweepHealth",
    "TaskItem",
    "Throughput",
    "ThroughputBucket",
    "Timeline",
    "backlog",
    "build_dashboard",
    "humanize_seconds",
    "item_census",
    "known_queues",
    "known_work_types",
    "lease_health",
    "live_workers",
    "process_counters",
    "processes_by_state",
    "recent_recoveries",
    "replica_lag",
    "retry_distribution",
    "status_count",
    "sweep_health",
    "task_timeline",
    "throughput",
]
