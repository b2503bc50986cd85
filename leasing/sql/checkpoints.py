"""Statements that append checkpoints and enforce their retention.

Sequence numbers are per task. Appends to one task are serialised by a
transaction-scoped advisory lock on PostgreSQL (SQLite's IMMEDIATE
transactions already hold its only write lock), taken in a statement of its
own so that the INSERT that follows computes `MAX(sequence_number) + 1` on a
snapshot that sees every number committed before: a number is never reused,
as retention only removes a task's oldest rows.
"""

from __future__ import annotations

from typing import Any

from ..states import CheckpointType
from .dialect import Dialect
from .runner import Statement
from .work_items import fence

ERROR_BOUNDARY = f"'{CheckpointType.ERROR_BOUNDARY.value}'"
COLUMNS = (
    "checkpoint_id, task_id, work_item_id, checkpoint_type, "
    "sequence_number, snapshot_data, metadata, created_at"
)


def task_locks(tasks: str) -> str:
    """PostgreSQL: a scalar subquery taking the checkpoint lock of each task of `tasks`.

    `tasks` is a query with one column `t`; the locks are taken in its order.
    Every holder of several task locks takes them in one (sorted) order, so
    two of them never wait for each other in a cycle.
    """
    return f"""(
        SELECT count(pg_advisory_xact_lock(hashtextextended('leasing.checkpoints:' || t, 0)))
        FROM ({tasks}) AS o
    )"""


def lock_tasks(task_ids: list[str]) -> Statement:
    """PostgreSQL: take the checkpoint locks of these tasks, in the given order."""
    ordered = "SELECT t FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n"
    return f"SELECT {task_locks(ordered)} AS locked", [task_ids]


def lease_fence(d: Dialect, item_id: str, holder: str, token: int) -> Statement:
    """Is the lease still held? Share-locks the item until commit on PostgreSQL,

    so the sweep cannot recover it while the checkpoint is being written.
    """
    sql = f"""
        SELECT 1 AS held FROM work_items WHERE work_item_id = %s AND {fence()}
        {"FOR SHARE" if d.is_postgres else ""}
    """
    return sql, [item_id, holder, token]


def append(
    d: Dialect,
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


def append_error_boundaries_sqlite(
    d: Dialect, rows: list[tuple[str, str, str, str]], metadata_json: str
) -> Statement:
    """SQLite: one `error_boundary` checkpoint per (checkpoint id, task, item, snapshot) row.

    Several rows of one task are numbered in the given order.
    """
    values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(rows))
    params: list[Any] = []
    for index, (checkpoint_id, task_id, item_id, snapshot) in enumerate(rows):
        params += [checkpoint_id, task_id, item_id, snapshot, index]
    sql = f"""
        WITH v(checkpoint_id, task_id, work_item_id, snapshot, ord) AS (VALUES {values})
        INSERT INTO checkpoints ({COLUMNS})
        SELECT v.checkpoint_id, v.task_id, v.work_item_id, {ERROR_BOUNDARY},
               COALESCE((SELECT MAX(sequence_number) FROM checkpoints AS existing
                         WHERE existing.task_id = v.task_id), 0)
               + row_number() OVER (PARTITION BY v.task_id ORDER BY v.ord),
               v.snapshot, %s, {d.now}
        FROM v
        RETURNING checkpoint_id
    """
    return sql, [*params, metadata_json]


def delete_beyond_retention(d: Dialect, retention: int, since: Any = None) -> Statement:
    """Delete all but the newest `retention` checkpoints of each task.

    With `since`, only tasks that gained a checkpoint since then are examined.
    On PostgreSQL the doomed rows are locked with SKIP LOCKED, so several
    sweeps cleaning at once split the work instead of waiting.
    """
    task_filter = ""
    params: list[Any] = []
    if since is not None:
        task_filter = (
            "WHERE task_id IN (SELECT DISTINCT task_id FROM checkpoints WHERE created_at >= %s)"
        )
        params.append(d.datetime_param(since))
    ranked = f"""
        SELECT checkpoint_id FROM (
            SELECT checkpoint_id,
                   row_number() OVER (PARTITION BY task_id
                                      ORDER BY sequence_number DESC) AS newest_first
            FROM checkpoints {task_filter}
        ) ranked
        WHERE newest_first > %s
    """
    doomed = ranked
    if d.is_postgres:
        # FOR UPDATE cannot sit beside a window function, hence the extra level.
        doomed = f"""
            SELECT checkpoint_id FROM checkpoints
            WHERE checkpoint_id IN ({ranked}) FOR UPDATE SKIP LOCKED
        """
    sql = f"DELETE FROM checkpoints WHERE checkpoint_id IN ({doomed}) RETURNING checkpoint_id"
    return sql, [*params, retention]
