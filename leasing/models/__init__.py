"""The tables, declared as models: `work_items`, `checkpoints`, `idempotency_keys`,
`workers`, `work_item_dependencies`, `schedules`, `leasing_pauses` and the
console's hourly rollup (`leasing_finished_hours`), and the marks of periodic passes
(`leasing_rollup_marks`: the rollup's, the sweep's checkpoint cleanup's).

Table and column names are the product's documented schema, so monitoring SQL
written against the tables runs unchanged. State changes do not live here:
they are the conditional statements of `leasing.sql`, called by
`leasing.services`. The querysets hold the named read filters the services,
admin and console share.
"""

from ..states import (
    CheckpointType,
    IdempotencyStatus,
    LeaseHealth,
    WorkerRequest,
    WorkerRole,
    WorkerStatus,
    WorkItemStatus,
)
from .checkpoints import Checkpoint, CheckpointQuerySet
from .dependencies import WorkItemDependency
from .idempotency import IdempotencyKey, IdempotencyKeyQuerySet
from .pauses import Pause, PauseQuerySet
from .processes import Worker, WorkerQuerySet
from .rates import RateBucket
from .rollups import FinishedHour, RollupMark
from .schedules import MissedPolicy, Schedule
from .work_items import WorkItem, WorkItemQuerySet

__all__ = [
    "Checkpoint",
    "CheckpointQuerySet",
    "CheckpointType",
    "FinishedHour",
    "IdempotencyKey",
    "IdempotencyKeyQuerySet",
    "IdempotencyStatus",
    "LeaseHealth",
    "MissedPolicy",
    "Pause",
    "PauseQuerySet",
    "RateBucket",
    "RollupMark",
    "Schedule",
    "WorkItem",
    "WorkItemDependency",
    "WorkItemQuerySet",
    "WorkItemStatus",
    "Worker",
    "WorkerQuerySet",
    "WorkerRequest",
    "WorkerRole",
    "WorkerStatus",
]
