"""Checkpoints: an append-only, per-task sequence of progress snapshots (SPEC §8).

`create_checkpoint()` appends with the task's next `sequence_number`. Appends to
one task are serialised (a transaction-scoped advisory lock on PostgreSQL, the
single write lock on SQLite) and the number is computed inside the INSERT, so
concurrent writers never collide and a number is never reused: retention only
removes the oldest rows, so the maximum survives.

A checkpoint written under a lease is fenced: the work item must still be
`in_progress` with the lease's holder and token, and that row is share-locked
until the checkpoint commits, so the sweep cannot recover the item halfway.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction

from . import validation
from .db import Dialect, execute, to_datetime, translate_db_errors
from .exceptions import InvalidInput, LeaseLostError, WorkItemNotFound
from .ids import new_ulid
from .lease import Lease
from .models import Checkpoint, CheckpointQuerySet, CheckpointType, WorkItem


def _work_item_id(work_item: WorkItem | str | None) -> str | None:
    if work_item is None:
        return None
    if isinstance(work_item, WorkItem):
        return work_item.work_item_id
    return validation.non_empty_text("work_item", work_item)


def lock_task_sequence(using: str, task_id: str) -> None:
    """Serialise sequence allocation for one task until the transaction ends.

    Call it inside `transaction.atomic()`, then compute MAX(sequence_number) + 1
    in a later statement: under READ COMMITTED that statement's snapshot is
    taken after the lock, so it sees every number committed before. SQLite
    needs no lock: an IMMEDIATE transaction already holds the only write lock.
    """
    if Dialect(using).is_postgres:
        execute(using, f"SELECT {task_locks_sql('SELECT %s AS t')}", [task_id])


def lock_task_sequences(using: str, task_ids: Iterable[str]) -> list[str]:
    """`lock_task_sequence()` for several tasks, in sorted order; returns that order.

    Every writer that holds more than one task lock takes them in the same
    (sorted) order, so two of them can never wait for each other in a cycle.
    On PostgreSQL all the locks are taken by one statement, whose ordered
    `unnest WITH ORDINALITY` keeps that order.
    """
    ordered = sorted(set(task_ids))
    if ordered and Dialect(using).is_postgres:
        ordered_sql = "SELECT t FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n"
        execute(using, f"SELECT {task_locks_sql(ordered_sql)}", [ordered])
    return ordered


def task_locks_sql(tasks: str) -> str:
    """PostgreSQL: a scalar subquery that takes the task lock of each row of `tasks`.

    `tasks` is a query with one column `t` (task ids); the locks are taken in
    its order and the subquery returns how many it took.
    """
    return f"""(
        SELECT count(pg_advisory_xact_lock(hashtextextended('leasing.checkpoints:' || t, 0)))
        FROM ({tasks}) AS o
    )"""


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
    task_id = validation.non_empty_text("task_id", task_id)
    checkpoint_type = CheckpointType.validate(checkpoint_type)
    if snapshot is None:
        raise InvalidInput("snapshot is required; use {} for an empty snapshot.")
    snapshot_json = validation.payload("snapshot", snapshot, required=True)
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInput(f"metadata must be a dict or None, got {type(metadata).__name__}.")
    metadata_json = validation.payload("metadata", metadata)
    item_id = _work_item_id(work_item)
    if lease is not None:
        if not isinstance(lease, Lease):
            raise InvalidInput(f"lease must be a Lease, got {lease!r}.")
        if item_id is not None and item_id != lease.work_item_id:
            raise InvalidInput(
                f"work_item {item_id!r} is not the leased item {lease.work_item_id!r}."
            )
        if lease.task_id != task_id:
            raise InvalidInput(
                f"task_id {task_id!r} is not the leased item's task {lease.task_id!r}."
            )
        item_id = lease.work_item_id

    d = Dialect(using)
    checkpoint_id = new_ulid()
    with translate_db_errors(), transaction.atomic(using=using):
        if lease is not None:
            fence = execute(
                using,
                f"""
                SELECT 1 AS held FROM work_items
                WHERE work_item_id = %s AND lease_holder = %s AND lease_token = %s
                  AND status = 'in_progress'
                {"FOR SHARE" if d.is_postgres else ""}
                """,
                [lease.work_item_id, lease.worker_id, lease.token],
            )
            if not fence:
                raise LeaseLostError(
                    f"Checkpoint refused: worker {lease.worker_id!r} no longer holds work item "
                    f"{lease.work_item_id!r} with token {lease.token}."
                )
        elif item_id is not None:
            found = execute(
                using, "SELECT task_id FROM work_items WHERE work_item_id = %s", [item_id]
            )
            if not found:
                raise WorkItemNotFound(item_id)
            if found[0]["task_id"] != task_id:
                # A checkpoint filed under another task would be invisible to
                # that item's resume_state() and timeline.
                raise InvalidInput(
                    f"work item {item_id!r} belongs to task {found[0]['task_id']!r}, "
                    f"not {task_id!r}."
                )
        lock_task_sequence(using, task_id)
        rows = execute(
            using,
            f"""
            INSERT INTO checkpoints (checkpoint_id, task_id, work_item_id, checkpoint_type,
                                     sequence_number, snapshot_data, metadata, created_at)
            SELECT %s, %s, %s, %s, COALESCE(MAX(sequence_number), 0) + 1,
                   {d.json_param()}, {d.json_param()}, {d.now}
            FROM checkpoints WHERE task_id = %s
            RETURNING sequence_number, created_at
            """,
            [
                checkpoint_id,
                task_id,
                item_id,
                checkpoint_type,
                snapshot_json,
                metadata_json,
                task_id,
            ],
        )
    checkpoint = Checkpoint(
        checkpoint_id=checkpoint_id,
        task_id=task_id,
        work_item_id=item_id,
        checkpoint_type=checkpoint_type,
        sequence_number=rows[0]["sequence_number"],
        snapshot_data=snapshot,
        metadata=metadata,
        created_at=to_datetime(rows[0]["created_at"]),
    )
    checkpoint._state.adding = False
    checkpoint._state.db = using
    return checkpoint


def checkpoints_for(task_id: str, *, using: str = "default") -> CheckpointQuerySet:
    """The task's checkpoints in sequence order."""
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
    retention: int,
    *,
    since: datetime | None = None,
    using: str = "default",
) -> int:
    """Keep the newest `retention` checkpoints of each task; return how many were deleted.

    With `since`, only tasks that gained a checkpoint at or after that time are
    examined (the sweep passes the time of its previous cleanup, so a pass
    costs what changed, not the size of the table).

    A task's newest checkpoint always survives (retention >= 1), so the next
    `MAX(sequence_number) + 1` never reuses a number. On PostgreSQL the rows to
    delete are locked with SKIP LOCKED: several sweeps cleaning at once split
    the work instead of waiting for (or deadlocking on) each other.
    """
    retention = validation.integer("retention", retention, minimum=1)
    d = Dialect(using)
    task_filter = ""
    params: list[Any] = []
    if since is not None:
        since = validation.aware_datetime("since", since)
        task_filter = (
            "WHERE task_id IN (SELECT DISTINCT task_id FROM checkpoints WHERE created_at >= %s)"
        )
        params.append(d.datetime_param(since))
    params.append(retention)
    ranked = f"""
        SELECT checkpoint_id FROM (
            SELECT checkpoint_id,
                   row_number() OVER (PARTITION BY task_id
                                      ORDER BY sequence_number DESC) AS newest_first
            FROM checkpoints {task_filter}
        ) ranked
        WHERE newest_first > %s
    """
    if d.is_postgres:
        # FOR UPDATE cannot sit beside a window function, hence the extra level.
        doomed = f"""
            SELECT checkpoint_id FROM checkpoints
            WHERE checkpoint_id IN ({ranked})
            FOR UPDATE SKIP LOCKED
        """
    else:
        doomed = ranked
    with translate_db_errors(), transaction.atomic(using=using):
        rows = execute(
            using,
            f"DELETE FROM checkpoints WHERE checkpoint_id IN ({doomed}) RETURNING checkpoint_id",
            params,
        )
    return len(rows)


__all__ = [
    "checkpoints_for",
    "cleanup_checkpoints",
    "create_checkpoint",
    "latest_checkpoint",
    "lock_task_sequence",
    "lock_task_sequences",
    "resume_state",
    "task_locks_sql",
]
