"""Statements that append checkpoints and enforce their retention.

Sequence numbers are per task. Appends to one task are serialised by a
transaction-scoped advisory lock on PostgreSQL (SQLite's IMMEDIATE
transactions already hold its only write lock), taken in a statement of its
own so that the INSERT that follows computes `MAX(sequence_number) + 1` on a
snapshot that sees every number committed before: a number is never reused,
as retention only removes a task's oldest rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..states import CheckpointType
from .runner import Statement
from .work_items import fence

if TYPE_CHECKING:
    from ..storage.base import Storage


ERROR_BOUNDARY = f"'{CheckpointType.ERROR_BOUNDARY.value}'"
ITERATION_END = f"'{CheckpointType.ITERATION_END.value}'"
COLUMNS = (
    "checkpoint_id, task_id, work_item_id, checkpoint_type, "
    "sequence_number, snapshot_data, metadata, created_at"
)


def lease_fence(d: Storage, item_id: str, holder: str, token: int) -> Statement:
    """Is the lease still held? Share-locks the item until commit on PostgreSQL,

    so the sweep cannot recover it while the checkpoint is being written.
    """
    sql = f"""
        SELECT 1 AS held FROM work_items WHERE work_item_id = %s AND {fence()}
        {d.row_lock("SHARE")}
    """
    return sql, [item_id, holder, token]


def append(
    d: Storage,
    *,
    checkpoint_id: str,
    task_id: str,
    item_id: str | None,
    checkpoint_type: str,
    snapshot_json: str,
    metadata_json: str | None,
    created_at: Any = None,
) -> Statement:
    """Append one checkpoint with the task's next sequence number (take its lock first).

    `created_at` defaults to the database clock; data seeding passes a past time.
    """
    created = d.now if created_at is None else "%s"
    sql = f"""
        INSERT INTO checkpoints ({COLUMNS})
        SELECT %s, %s, %s, %s, COALESCE(MAX(sequence_number), 0) + 1,
               {d.json()}, {d.json()}, {created}
        FROM checkpoints WHERE task_id = %s
        RETURNING sequence_number, created_at
    """
    params: list[Any] = [
        checkpoint_id,
        task_id,
        item_id,
        checkpoint_type,
        snapshot_json,
        metadata_json,
        *([] if created_at is None else [d.datetime_param(created_at)]),
        task_id,
    ]
    return sql, params


def tasks_past_retention(d: Storage, retention: int, since: Any = None) -> Statement:
    """The tasks whose checkpoints retention trims (a query of `task_id`s), for
    `Storage.trim_checkpoints`, which deletes all but the newest `retention` of each
    (and its `resume_point`).

    Only tasks numbered past `retention` are read at all: a task's numbers are
    distinct and at least 1, so one with more than `retention` rows holds a
    number above it. With `since`, a task is examined if a checkpoint created
    since then is numbered past `retention`: appends number a task's rows and
    stamp them with the database clock in the same order (each takes the
    task's lock before its INSERT), so a task that gained rows has its
    highest number among them. (A row seeded with an older `created_at`
    waits for a cleanup without `since`, as the sweep runs one a day.)
    Most tasks never reach `retention`, and most passes then read only the
    new rows' index entries, where ranking every row of every task that
    gained one made each pass's cost grow with the table.
    """
    tasks = "SELECT DISTINCT task_id FROM checkpoints WHERE sequence_number > %s"
    params: list[Any] = [retention]
    if since is not None:
        tasks += " AND created_at >= %s"
        params.append(d.datetime_param(since))
    return tasks, params


def resume_point(row: str) -> str:
    """SQL: the checkpoint `row` (a table name or alias) is its task's resume point.

    That is its newest `iteration_end` (what `resume_state()` returns): retention
    keeps it whatever its age, as a retry (the worker's, the sweep's or an
    operator's) resumes from it. Without it, the attempts' own `error_boundary`
    records (and operators' `state_transition`s) could push a task's resume
    point out of the newest `retention` and its next attempt would start over.
    Evaluated for the rows retention would delete only: an `iteration_end`
    among them looks for a newer one of its task, and finds the next one.
    """
    return f"""({row}.checkpoint_type = {ITERATION_END} AND NOT EXISTS (
        SELECT 1 FROM checkpoints AS newer
        WHERE newer.task_id = {row}.task_id AND newer.checkpoint_type = {ITERATION_END}
          AND newer.sequence_number > {row}.sequence_number))"""
