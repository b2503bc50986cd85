"""Checkpoints: an append-only, per-task sequence of progress snapshots.

`create_checkpoint()` appends with the task's next `sequence_number`;
concurrent writers never collide and a number is never reused. A checkpoint
written under a lease is fenced: the item must still be `in_progress` with the
lease's holder and token, and on PostgreSQL that row stays share-locked until
the checkpoint commits, so the sweep cannot recover the item halfway.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .. import tracing, validation
from ..exceptions import InvalidInput, LeaseLostError, WorkItemNotFound
from ..ids import new_ulid
from ..sql import checkpoints as sql
from ..sql import marks
from ..sql import work_items as work_items_sql
from ..sql.runner import run, run_one, to_datetime, translate_db_errors
from ..states import CheckpointType
from ..storage import storage_for
from .held import Lease, leased_ids

if TYPE_CHECKING:
    from ..models import Checkpoint, CheckpointQuerySet, WorkItem

# The sweep's cleanup re-examines the tasks given a checkpoint since the
# previous cleanup to the same retention began, minus this overlap: a
# checkpoint's created_at is its statement time, and its transaction may
# commit a little later.
CLEANUP_OVERLAP = timedelta(seconds=60)
# ...and examines every task this often: a row stamped with an older
# created_at than its commit deserves (seeded data) is then trimmed too.
FULL_CLEANUP_EVERY = timedelta(days=1)


def lock_task_sequences(using: str, task_ids: Iterable[str]) -> list[str]:
    """Take the checkpoint locks of these tasks in sorted order (inside a transaction).

    Returns that order (where one writer at a time needs no lock, none is taken).
    """
    ordered = sorted(set(task_ids))
    storage_for(using).lock_tasks(ordered)
    return ordered


def _item_id(work_item: WorkItem | str | None) -> str | None:
    if work_item is None:
        return None
    if hasattr(work_item, "work_item_id"):  # a WorkItem
        return work_item.work_item_id
    return validation.non_empty_text("work_item", work_item)


# The engine's own records (an attempt's `error_boundary`, an operator's
# `state_transition`) are bounded by how they are built (the error and the
# traceback are cut), not by MAX_PAYLOAD_BYTES, which bounds what users store:
# a small setting must never keep a worker from recording a failure (it handed
# the item back and claimed it again, round after round, with no attempt counted).
RECORD_LIMIT = 1 << 20


@tracing.traced_checkpoint
def create_checkpoint(
    task_id: str,
    checkpoint_type: str,
    snapshot: Any,
    work_item: WorkItem | str | None = None,
    metadata: dict[str, Any] | None = None,
    lease: Lease | None = None,
    *,
    using: str = "default",
) -> Checkpoint:
    """Append a checkpoint to `task_id` and return it.

    With `lease`, the write is fenced by the lease's holder and token and the
    checkpoint is attached to the leased item; `LeaseLostError` means the lease
    is gone and nothing was written.
    """
    return _append(task_id, checkpoint_type, snapshot, work_item, metadata, lease, using, None)


@tracing.traced_checkpoint
def record_checkpoint(
    task_id: str,
    checkpoint_type: str,
    snapshot: Any,
    work_item: str | None,
    metadata: dict[str, Any] | None = None,
    *,
    using: str = "default",
) -> Checkpoint:
    """The engine's own record of what happened to an item (see `RECORD_LIMIT`)."""
    return _append(
        task_id, checkpoint_type, snapshot, work_item, metadata, None, using, RECORD_LIMIT
    )


def _append(
    task_id: str,
    checkpoint_type: str,
    snapshot: Any,
    work_item: WorkItem | str | None,
    metadata: dict[str, Any] | None,
    lease: Lease | None,
    using: str,
    limit: int | None,
) -> Checkpoint:
    using = validation.database_alias(using)
    task_id = validation.non_empty_text("task_id", task_id)
    checkpoint_type = CheckpointType.validate(checkpoint_type)
    if snapshot is None:
        raise InvalidInput("snapshot is required; use {} for an empty snapshot.")
    snapshot_json = validation.payload("snapshot", snapshot, required=True, limit=limit)
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInput(f"metadata must be a dict or None, got {type(metadata).__name__}.")
    metadata_json = validation.payload("metadata", metadata)
    item_id = _item_id(work_item)
    if lease is not None:
        item_id, _ = leased_ids(lease, item_id, task_id)

    d = storage_for(using)
    checkpoint_id = new_ulid()
    with translate_db_errors(), transaction.atomic(using=using):
        if lease is not None:
            fence = sql.lease_fence(d, lease.work_item_id, lease.worker_id, lease.token)
            if not run(using, fence):
                raise LeaseLostError(
                    f"Checkpoint refused: worker {lease.worker_id!r} no longer holds work item "
                    f"{lease.work_item_id!r} with token {lease.token}."
                )
        elif item_id is not None:
            found = run_one(using, work_items_sql.exists(item_id))
            if found is None:
                raise WorkItemNotFound(item_id)
            if found["task_id"] != task_id:
                # A checkpoint filed under another task would be invisible to
                # that item's resume_state() and timeline.
                raise InvalidInput(
                    f"work item {item_id!r} belongs to task {found['task_id']!r}, not {task_id!r}."
                )
        lock_task_sequences(using, [task_id])
        row = run_one(
            using,
            sql.append(
                d,
                checkpoint_id=checkpoint_id,
                task_id=task_id,
                item_id=item_id,
                checkpoint_type=checkpoint_type,
                snapshot_json=snapshot_json,
                metadata_json=metadata_json,
            ),
        )
    assert row is not None
    created_at = to_datetime(row["created_at"])
    assert created_at is not None  # a NOT NULL column
    # Models load only after django.setup(); this module must import before it.
    from ..models import Checkpoint

    checkpoint = Checkpoint(
        checkpoint_id=checkpoint_id,
        task_id=task_id,
        work_item_id=item_id,
        checkpoint_type=checkpoint_type,
        sequence_number=row["sequence_number"],
        snapshot_data=snapshot,
        metadata=metadata,
        created_at=created_at,
    )
    checkpoint._state.adding = False
    checkpoint._state.db = using
    return checkpoint


def checkpoints_for(task_id: str, *, using: str = "default") -> CheckpointQuerySet:
    """The task's checkpoints in sequence order."""
    using = validation.database_alias(using)
    from ..models import Checkpoint  # models load only after django.setup()

    return Checkpoint.objects.using(using).for_task(validation.non_empty_text("task_id", task_id))


def latest_checkpoint(
    task_id: str, checkpoint_type: str | None = None, *, using: str = "default"
) -> Checkpoint | None:
    """The task's newest checkpoint (of one type, if given), or None."""
    qs = checkpoints_for(task_id, using=using)
    if checkpoint_type is not None:
        qs = qs.of_type(checkpoint_type)
    return qs.order_by("-sequence_number").first()


def resume_state(task_id: str, *, using: str = "default") -> Any:
    """The snapshot of the task's last `iteration_end` checkpoint, or None.

    A retried handler starts from here instead of from the beginning.
    """
    checkpoint = latest_checkpoint(task_id, CheckpointType.ITERATION_END, using=using)
    return None if checkpoint is None else checkpoint.snapshot_data


def cleanup_checkpoints(
    retention: int, *, since: datetime | None = None, using: str = "default"
) -> int:
    """Keep the newest `retention` checkpoints of each task, and its resume point (its
    newest `iteration_end`, whatever its age); return how many were deleted.

    Only tasks numbered past `retention` are examined; with `since`, only
    those given such a number at or after that time (the sweep passes the time
    of its previous cleanup, so a pass costs what changed, not the size of the
    table; see `sql.checkpoints.tasks_past_retention`). A task's newest
    checkpoint always survives (retention >= 1), so the next number is never
    a reused one.
    """
    retention = validation.integer("retention", retention, minimum=1)
    since = validation.aware_datetime("since", since)
    d = storage_for(using)
    with translate_db_errors(), transaction.atomic(using=using):
        rows = run(using, d.trim_checkpoints(retention, since))
    return len(rows)


@dataclass(frozen=True)
class CleanupResult:
    deleted: int  # checkpoints deleted
    whole_table: bool  # every task examined, not only those given checkpoints since the mark


def _mark_names(retention: int) -> tuple[str, str]:
    """The marks of the cleanups to `retention`: the last one, the last whole-table one."""
    return f"checkpoint_cleanup:{retention}", f"checkpoint_full_cleanup:{retention}"


def cleanup_checkpoints_since_mark(
    retention: int, *, at: datetime, using: str = "default"
) -> CleanupResult:
    """The sweep's cleanup: only the tasks given checkpoints since the last one began.

    Where the last cleanup to this retention began (`at`, the database time
    its pass began) is kept in the database (`leasing.sql.marks`), so a new
    sweep process, a `recoverysweep --once` under cron or a second sweep
    carries on from it: only the first cleanup to a retention, and one a
    day (`FULL_CLEANUP_EVERY`), read the whole table, whose size is otherwise
    never paid for. The marks move in the cleanup's transaction, so a cleanup
    rolled back leaves them where they were.
    """
    retention = validation.integer("retention", retention, minimum=1)
    if validation.aware_datetime("at", at) is None:
        raise InvalidInput("at must be a datetime, got None.")
    d = storage_for(using)
    last_name, full_name = _mark_names(retention)
    with translate_db_errors():
        found = {
            r["name"]: r["through"] for r in run(using, marks.read_marks([last_name, full_name]))
        }
        last_at, full_at = (to_datetime(found.get(name)) for name in (last_name, full_name))
        whole_table = last_at is None or full_at is None or at - full_at >= FULL_CLEANUP_EVERY
        since = None if whole_table or last_at is None else last_at - CLEANUP_OVERLAP
        with transaction.atomic(using=using):
            rows = run(using, d.trim_checkpoints(retention, since))
            run(using, marks.advance_mark(d, last_name, at))
            if whole_table:
                run(using, marks.advance_mark(d, full_name, at))
    return CleanupResult(deleted=len(rows), whole_table=whole_table)


__all__ = [
    "CleanupResult",
    "checkpoints_for",
    "cleanup_checkpoints",
    "cleanup_checkpoints_since_mark",
    "create_checkpoint",
    "latest_checkpoint",
    "lock_task_sequences",
    "resume_state",
]
