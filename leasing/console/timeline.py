"""Checkpoints: a task's timeline and the newest `error_boundary` entries.

Recoveries read `checkpoints_type_idx`; a timeline the `(task_id,
sequence_number)` unique index.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.db.models.fields.json import KeyTextTransform

from ..models import Checkpoint, CheckpointType, WorkItem, WorkItemStatus


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """One checkpoint; `snapshot` and `metadata` are None unless payloads were requested."""

    checkpoint_id: str
    task_id: str
    work_item_id: str | None
    checkpoint_type: str
    sequence_number: int
    created_at: datetime
    snapshot: Any = None
    metadata: Any = None
    payload_included: bool = False
    # An operator action's record in words (who, what, why): not payload, shown to all.
    operator: str | None = None

    @property
    def type_label(self) -> str:
        return str(CheckpointType(self.checkpoint_type).label)


_ENTRY_COLUMNS = (
    "checkpoint_id",
    "task_id",
    "work_item_id",
    "checkpoint_type",
    "sequence_number",
    "created_at",
)


# What an operator action's `state_transition` records, read without the rest of its snapshot.
_OPERATOR_KEYS = ("action", "actor", "reason", "work_item_id", "old_status")


def entries(
    queryset: QuerySet[Checkpoint], include_payloads: bool, *, operator: bool = False
) -> list[CheckpointEntry]:
    """The rows of a checkpoint queryset as entries (payload columns only when asked;
    `operator`: each operator action's record in words)."""
    columns = list(_ENTRY_COLUMNS)
    if include_payloads:
        columns += ["snapshot_data", "metadata"]
    if operator:
        queryset = queryset.annotate(
            **{f"op_{k}": KeyTextTransform(k, "snapshot_data") for k in _OPERATOR_KEYS}
        )
        columns += [f"op_{k}" for k in _OPERATOR_KEYS]
    return [
        CheckpointEntry(
            **{name: row[name] for name in _ENTRY_COLUMNS},
            snapshot=row.get("snapshot_data"),
            metadata=row.get("metadata"),
            payload_included=include_payloads,
            operator=_operator_summary(row) if operator else None,
        )
        for row in queryset.values(*columns)
    ]


def _operator_summary(row: dict[str, Any]) -> str | None:
    """`delete of 01J… (was pending) by alice: test data`; None for other checkpoints."""
    if row["checkpoint_type"] != CheckpointType.STATE_TRANSITION or not row.get("op_action"):
        return None
    action = str(row["op_action"]).replace("_", " ")
    of = f" of {row['op_work_item_id']}" if row.get("op_work_item_id") else ""
    was = f" (was {row['op_old_status']})" if row.get("op_old_status") else ""
    return f"{action}{of}{was} by {row.get('op_actor') or '?'}: {row.get('op_reason') or ''}"


def recent_recoveries(
    *, limit: int = 10, include_payloads: bool = False, using: str = "default"
) -> tuple[CheckpointEntry, ...]:
    """The newest `error_boundary` checkpoints (sweep recoveries and handler errors)."""
    queryset = (
        Checkpoint.objects.using(using)
        .filter(checkpoint_type=CheckpointType.ERROR_BOUNDARY)
        .order_by("-created_at")[:limit]
    )
    return tuple(entries(queryset, include_payloads))


@dataclass(frozen=True, slots=True)
class TaskItem:
    """A work item of the task shown above its timeline."""

    work_item_id: str
    work_type: str
    status: str
    retry_count: int
    max_retries: int
    lease_holder: str | None
    lease_token: int
    created_at: datetime
    completed_at: datetime | None

    @property
    def status_label(self) -> str:
        return str(WorkItemStatus(self.status).label)


@dataclass(frozen=True, slots=True)
class Timeline:
    """A task's checkpoints in sequence order (the newest `limit` of them)."""

    task_id: str
    entries: tuple[CheckpointEntry, ...]
    total: int
    items: tuple[TaskItem, ...]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.entries)


TIMELINE_LIMIT = 500
TASK_ITEMS_LIMIT = 50


def task_timeline(
    task_id: str,
    *,
    include_payloads: bool = False,
    limit: int = TIMELINE_LIMIT,
    using: str = "default",
) -> Timeline:
    """The task's checkpoints (the timeline monitoring query) and its work items.

    Retention keeps 100 checkpoints per task by default; `limit` bounds the
    page for tasks kept longer, showing the newest ones.
    """
    checkpoints = Checkpoint.objects.using(using).filter(task_id=task_id)
    newest = checkpoints.order_by("-sequence_number")[:limit]
    shown = sorted(
        entries(newest, include_payloads, operator=True), key=lambda e: e.sequence_number
    )
    total = len(shown) if len(shown) < limit else checkpoints.count()
    items = tuple(
        TaskItem(**row)
        for row in WorkItem.objects.using(using)
        .filter(task_id=task_id)
        .order_by("-created_at", "-work_item_id")
        .values(*(f.name for f in fields(TaskItem)))[:TASK_ITEMS_LIMIT]
    )
    return Timeline(
        task_id=task_id,
        entries=tuple(shown),
        total=total,
        items=items,
    )
