"""PostgreSQL's recovery of a batch of expired leases: two statements in one transaction.

Step 1 locks a batch of expired rows with SKIP LOCKED (and its tasks'
checkpoint locks); step 2 recovers them by their addresses, writes their
`error_boundary` checkpoints and wakes idle workers, in one statement.
Nothing travels per item but what the caller asks for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...sql.checkpoints import COLUMNS, ERROR_BOUNDARY
from ...sql.new_items import NOTIFY_CHANNEL
from ...sql.recovery import decisions, pick_filter, recovered_set, superseded
from ...sql.runner import Statement, load_json, run_one
from ...sql.snapshots import error_boundary_sql
from ...sql.unique import other_holder
from ...sql.work_items import CANCELLED, FAILED, IN_PROGRESS, PENDING
from ..base import Pick, Recovered
from .claims import task_locks

if TYPE_CHECKING:
    from . import PostgresStorage


def recover(
    d: PostgresStorage,
    batch_size: int,
    fail_types: list[str],
    *,
    pick: Pick,
    checkpoint_ids: Callable[[int], list[str]] | None,
    metadata_json: str,
    report_items: bool,
) -> Recovered:
    """Recover up to `batch_size` expired leases (inside the caller's transaction)."""
    statement = lock_expired(
        d,
        batch_size,
        lock_tasks=checkpoint_ids is not None,
        exclude=list(pick.exclude),
        only=pick.only,
    )
    locked = run_one(d.using, statement)
    found = locked["found"] if locked else 0
    if not locked or not found:
        return Recovered()
    statement = recover_locked(
        d,
        locked["tids"],
        fail_types,
        checkpoint_ids=None if checkpoint_ids is None else checkpoint_ids(found),
        metadata_json=metadata_json,
        report_items=report_items,
    )
    counts = run_one(d.using, statement) or {}
    return Recovered(
        found=found,
        requeued=counts.get("requeued", 0),
        failed=counts.get("failed", 0),
        cancelled=counts.get("cancelled", 0),
        checkpoints=counts.get("checkpoints", 0),
        failed_with_dependents=tuple(counts.get("failed_with_dependents") or ()),
        items=tuple(load_json(counts.get("items")) or ()),
    )


# The recovered items, for the lease_expired signal: [id, holder, token, status, timed out].
ITEMS = """(SELECT json_agg(json_build_array(x.work_item_id, x.lease_holder, x.lease_token,
                                          y.status, x.timed_out = 1))
           FROM c AS x JOIN recovered AS y ON y.work_item_id = x.work_item_id)"""


def lock_expired(
    d: PostgresStorage,
    batch_size: int,
    *,
    lock_tasks: bool,
    exclude: list[str] | None = None,
    only: str | None = None,
) -> Statement:
    """Step 1: lock a batch of expired rows (and their tasks' checkpoint locks).

    `FOR NO KEY UPDATE SKIP LOCKED`: other sweeps and busy workers skip
    them; the lock re-checks status and expiry on the newest row version.
    NO KEY UPDATE is the lock the UPDATE itself takes: it conflicts with a
    worker's FOR SHARE checkpoint fence but not with a foreign-key check's
    FOR KEY SHARE. The rows come back as one array literal of their
    addresses (ctid), by which step 2 reads and updates them: a row locked by
    this transaction cannot move until it commits.
    """
    picked, picked_params = pick_filter(d, exclude or [], only)
    locks = "0"
    if lock_tasks:
        # Sorted by code point, as every holder of several task locks sorts them.
        locks = task_locks('SELECT DISTINCT task_id COLLATE "C" AS t FROM locked ORDER BY 1')
    sql = f"""
        WITH locked AS (
            SELECT ctid, task_id FROM work_items
            WHERE status = {IN_PROGRESS} AND lease_expires_at < statement_timestamp() {picked}
            ORDER BY lease_expires_at
            LIMIT %s
            FOR NO KEY UPDATE SKIP LOCKED
        )
        SELECT count(*) AS found, array_agg(ctid)::text AS tids, {locks} AS task_locks
        FROM locked
    """
    return sql, [*picked_params, batch_size]


def recover_locked(
    d: PostgresStorage,
    tids: str,
    fail_types: list[str],
    *,
    checkpoint_ids: list[str] | None,
    metadata_json: str,
    report_items: bool = False,
) -> Statement:
    """Step 2: recover the locked rows, write their checkpoints, wake workers.

    Returns one row of counts (requeued, failed, cancelled, checkpoints) and
    the ids of the ended items (failed or cancelled) something depends on:
    nothing else travels per item, unless `report_items` asks for the
    recovered items (for the `lease_expired` signal) as one JSON array. Each
    task's last sequence number is read in `c`, which is complete before the
    first checkpoint is inserted.
    """
    set_sql, set_params = recovered_set(d)
    fail_sql = "work_type = ANY(%s::text[])"
    top_sequence = ""
    checkpoints_sql = ""
    checkpoint_params: list[Any] = []
    if checkpoint_ids is not None:
        top_sequence = """,
               COALESCE((SELECT MAX(sequence_number) FROM checkpoints AS e
                         WHERE e.task_id = work_items.task_id), 0) AS top_sequence"""
        snapshot = error_boundary_sql(
            {
                "error": "r.error_message",
                "reason": f"""CASE WHEN r.status = {CANCELLED} THEN 'cancelled'
                    WHEN c.will_retry = 1 AND r.status <> {PENDING} THEN 'superseded'
                    WHEN c.timed_out = 1 THEN 'timed_out' ELSE 'lease_expired' END""",
                "worker_id": "c.lease_holder",
                "lease_token": "c.lease_token",
                "attempt": "c.retry_count + 1",
                "retry_count": "r.retry_count",
                "max_retries": "c.max_retries",
                "will_retry": f"r.status = {PENDING}",
                "new_status": "r.status",
                "work_type": "c.work_type",
                "lease_expires_at": "c.lease_expires_at",
                "heartbeat_at": "c.heartbeat_at",
                "lease_acquired_at": "c.lease_acquired_at",
            }
        )
        # The ids join by position (subscripting a text[] walks it from the start).
        checkpoints_sql = f"""
        , written AS (
            INSERT INTO checkpoints ({COLUMNS})
            SELECT ids.checkpoint_id, x.task_id, x.work_item_id, {ERROR_BOUNDARY},
                   x.top_sequence + x.nth_of_task, x.snapshot, %s::jsonb, {d.now}
            FROM (
                SELECT c.task_id, c.work_item_id, c.top_sequence,
                       row_number() OVER (ORDER BY c.task_id, c.work_item_id) AS position,
                       row_number() OVER (PARTITION BY c.task_id ORDER BY c.work_item_id)
                           AS nth_of_task,
                       {snapshot} AS snapshot
                FROM c JOIN recovered AS r ON r.work_item_id = c.work_item_id
            ) AS x
            JOIN unnest(%s::text[]) WITH ORDINALITY AS ids(checkpoint_id, position)
                ON ids.position = x.position
            RETURNING 1
        )"""
        # ULIDs are [0-9A-Z]: an array literal needs no quoting.
        checkpoint_params = [metadata_json, "{" + ",".join(checkpoint_ids) + "}"]
    sql = f"""
        WITH c0 AS (
            SELECT ctid, work_item_id, task_id, work_type, lease_holder, lease_token,
                   lease_expires_at, heartbeat_at, lease_acquired_at, retry_count, max_retries,
                   unique_key, unique_scope, {other_holder("work_items")} AS holder,
                   {decisions(d, fail_sql)}{top_sequence}
            FROM work_items WHERE ctid = ANY(%s::tid[])
        ), c AS ({superseded("c0")}), recovered AS (
            UPDATE work_items AS w SET {set_sql}
            FROM c
            WHERE w.ctid = c.ctid AND w.lease_token = c.lease_token
            RETURNING w.work_item_id, w.status, w.retry_count, w.error_message,
                      w.queue_name, w.updated_at, w.has_dependents
        ){checkpoints_sql}
        SELECT count(*) FILTER (WHERE status = {PENDING}) AS requeued,
               count(*) FILTER (WHERE status = {FAILED}) AS failed,
               count(*) FILTER (WHERE status = {CANCELLED}) AS cancelled,
               -- Ended items (failed or cancelled) that others depend on: the service
               -- settles them next.
               array_agg(work_item_id) FILTER (WHERE status <> {PENDING} AND has_dependents)
                   AS failed_with_dependents,
               {"(SELECT count(*) FROM written)" if checkpoint_ids is not None else "0"}
                   AS checkpoints,
               {ITEMS if report_items else "NULL"} AS items,
               -- Re-queued items are claimable at once: wake idle workers (on commit).
               (SELECT count(pg_notify(%s, q))
                FROM (SELECT DISTINCT queue_name AS q FROM recovered
                      WHERE status = {PENDING}) AS n) AS notified
        FROM recovered
    """
    params = [
        fail_types,
        fail_types,
        tids,
        *set_params,
        *checkpoint_params,
        NOTIFY_CHANNEL,
    ]
    return sql, params
