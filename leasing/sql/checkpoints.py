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

    Only tasks numbered past `retention` are read at all: a task's numbers are
    distinct and at least 1, so one with more than `retention` rows holds a
    number above it. With `since`, a task is examined if a checkpoint created
    since then is numbered past `retention`: appends number a task's rows and
    stamp them with the database clock in the same order (each takes the
    task's lock before its INSERT), so a task that gained rows has its
    highest number among them. (A row seeded with an older `created_at`
    waits for a cleanup without `since`, as the sweep runs one a day.)
    Most tasks never reach `retention`, and most passes then read only the
    new rows' index entries: ranking every row of every task that gained one
    cost a sweep pass 130 ms at 200 checkpoints a second (each pass looks
    back a minute), and the first pass over 1,000,000 checkpoints 0.5 s.

    On PostgreSQL each task's doomed rows are read from its index, newest
    first past the `retention` it keeps, and locked with SKIP LOCKED, so
    several sweeps cleaning at once split the work instead of waiting.
    """
    tasks = "SELECT DISTINCT task_id FROM checkpoints WHERE sequence_number > %s"
    params: list[Any] = [retention]
    if since is not None:
        tasks += " AND created_at >= %s"
        params.append(d.datetime_param(since))
    if d.is_postgres:
        # ARRAY(...) runs each level once, then fetches by primary key,
        # whatever the planner guesses of how many rows it holds.
        doomed = f"""
            SELECT x.checkpoint_id FROM ({tasks}) AS n
            CROSS JOIN LATERAL (
                SELECT checkpoint_id FROM checkpoints AS c WHERE c.task_id = n.task_id
                ORDER BY c.sequence_number DESC OFFSET %s
            ) AS x
        """
        sql = f"""
            DELETE FROM checkpoints WHERE checkpoint_id = ANY(ARRAY(
                SELECT checkpoint_id FROM checkpoints
                WHERE checkpoint_id = ANY(ARRAY({doomed}))
                FOR UPDATE SKIP LOCKED))
            RETURNING checkpoint_id
        """
        return sql, [*params, retention]
    ranked = f"""
        SELECT checkpoint_id FROM (
            SELECT checkpoint_id,
                   row_number() OVER (PARTITION BY task_id
                                      ORDER BY sequence_number DESC) AS newest_first
            FROM checkpoints WHERE task_id IN ({tasks})
        ) ranked
        WHERE newest_first > %s
    """
    sql = f"DELETE FROM checkpoints WHERE checkpoint_id IN ({ranked}) RETURNING checkpoint_id"
    return sql, [*params, retention]
