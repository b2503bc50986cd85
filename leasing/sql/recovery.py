"""The sweep's statements: recover a batch of expired leases with their checkpoints.

For each `in_progress` item whose lease ran out (database clock), in one
conditional UPDATE per batch: back to `pending` with `retry_count + 1` while
retries remain and the work type allows a retry after an expired lease,
otherwise `failed` for good; one `error_boundary` checkpoint per item in the
same transaction. The UPDATE re-checks the token (and on SQLite the status
and the expiry), so an item its worker renewed or completed a moment earlier
is left alone. A lease that ran into its deadline (the handler's timeout or
`MAX_LEASE_LIFETIME`) is reported as "Timed out after N s".

Passing through the `expired` status: the CHECK constraint allows it, as the
original schema lists it, but recovery moves an item from `in_progress`
straight to `pending` or `failed` inside one statement, so no row ever rests
in it.
"""

from __future__ import annotations

from typing import Any

from .. import transitions as T
from .checkpoints import COLUMNS, ERROR_BOUNDARY, task_locks
from .dialect import Dialect
from .new_items import NOTIFY_CHANNEL
from .runner import Statement
from .snapshots import error_boundary_sql
from .unique import other_holder
from .work_items import IN_PROGRESS, PENDING, attempt_ended_set

MAX_RETRIES_MESSAGE = "Max retries exceeded"
# The recovered items, for the lease_expired signal: [id, holder, token, status, timed out].
ITEMS = """(SELECT json_agg(json_build_array(x.work_item_id, x.lease_holder, x.lease_token,
                                          y.status, x.timed_out = 1))
           FROM c AS x JOIN recovered AS y ON y.work_item_id = x.work_item_id)"""
FAIL_POLICY_MESSAGE = "Lease expired - not retried (on_lease_expired=fail)"
# `retry N/M` and `Timed out after N s` are built in SQL from the row.


def _error_message(d: Dialect, c: str = "c", w: str = "w") -> str:
    """The recovered item's error_message, from the candidate row `c` and the item `w`."""
    cast = "TEXT"
    retry = (
        f"' - retry ' || CAST({w}.retry_count + 1 AS {cast}) || '/' "
        f"|| CAST({w}.max_retries AS {cast})"
    )
    return f"""CASE
        WHEN {c}.timed_out = 1 THEN 'Timed out after ' || CAST({c}.cap_seconds AS {cast}) || ' s'
             || CASE WHEN {c}.will_retry = 1 THEN {retry} ELSE '' END
        WHEN {c}.will_retry = 1 THEN 'Lease expired' || {retry}
        WHEN {c}.fail_policy = 1 THEN %s
        ELSE %s END"""


def _decisions(d: Dialect, fail_types_sql: str) -> str:
    """Per candidate: will it be retried, does its type fail on expiry, did it time out."""
    timed_out = "lease_deadline_at IS NOT NULL AND lease_expires_at >= lease_deadline_at"
    return f"""
        CASE WHEN retry_count < max_retries AND NOT ({fail_types_sql}) THEN 1 ELSE 0 END
            AS will_retry,
        CASE WHEN {fail_types_sql} THEN 1 ELSE 0 END AS fail_policy,
        CASE WHEN {timed_out} THEN 1 ELSE 0 END AS timed_out,
        {d.seconds_between("lease_deadline_at", "lease_acquired_at")} AS cap_seconds
    """


def _recovered_set(d: Dialect) -> Statement:
    sql = attempt_ended_set(
        d,
        T.EXPIRE,
        retrying="c.will_retry = 1",
        run_after="NULL",
        error=_error_message(d),
        superseded_by="c.superseded_by",
        row="w",
    )
    # The message twice: in the superseded branch and in the other.
    return sql, [FAIL_POLICY_MESSAGE, MAX_RETRIES_MESSAGE] * 2


def _superseded(candidates: str) -> str:
    """`candidates` with `superseded_by`: who holds each one's unique key if it returned.

    Another item holding the key now, else the retried candidate of the same
    key with the lowest id (several expired items of one `pending`-scoped key
    cannot all return to pending: the first does, the others are superseded by it).
    """
    return f"""
        SELECT c0.*, COALESCE(c0.holder, (
            SELECT min(s.work_item_id) FROM {candidates} AS s
            WHERE s.unique_key = c0.unique_key AND s.unique_scope = c0.unique_scope
              AND s.will_retry = 1 AND s.work_item_id < c0.work_item_id
        )) AS superseded_by
        FROM {candidates} AS c0
    """


def _picked(d: Dialect, exclude: list[str], only: str | None) -> Statement:
    """The sweep's own filter on expired rows: skip rows that failed alone, or take one."""
    if only is not None:
        return "AND work_item_id = %s", [only]
    if not exclude:
        return "", []
    excluded, params = d.in_list("work_item_id", exclude)
    return f"AND NOT ({excluded})", params


def expired_ids(d: Dialect, limit: int, exclude: list[str]) -> Statement:
    """The ids of up to `limit` expired leases in the sweep's order (none locked)."""
    picked, params = _picked(d, exclude, None)
    sql = f"""
        SELECT work_item_id FROM work_items
        WHERE status = {IN_PROGRESS} AND lease_expires_at < {d.now} {picked}
        ORDER BY lease_expires_at LIMIT %s
    """
    return sql, [*params, limit]


def lock_expired_postgres(
    d: Dialect,
    batch_size: int,
    *,
    lock_tasks: bool,
    exclude: list[str] | None = None,
    only: str | None = None,
) -> Statement:
    """PostgreSQL, step 1: lock a batch of expired rows (and their tasks' checkpoint locks).

    `FOR NO KEY UPDATE SKIP LOCKED`: other sweeps and busy workers skip
    them; the lock re-checks status and expiry on the newest row version.
    NO KEY UPDATE is the lock the UPDATE itself takes: it conflicts with a
    worker's FOR SHARE checkpoint fence but not with a foreign-key check's
    FOR KEY SHARE. The rows come back as one array literal of their
    addresses (ctid), by which step 2 reads and updates them: a row locked by
    this transaction cannot move until it commits.
    """
    picked, picked_params = _picked(d, exclude or [], only)
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


def recover_locked_postgres(
    d: Dialect,
    tids: str,
    fail_types: list[str],
    *,
    checkpoint_ids: list[str] | None,
    metadata_json: str,
    report_items: bool = False,
) -> Statement:
    """PostgreSQL, step 2: recover the locked rows, write their checkpoints, wake workers.

    Returns one row of counts (requeued, failed, checkpoints) and the ids of
    the failed items something depends on: nothing else travels per item,
    unless `report_items` asks for the recovered items (for the
    `lease_expired` signal) as one JSON array. Each task's last sequence
    number is read in `c`, which is complete before the first checkpoint is
    inserted.
    """
    set_sql, set_params = _recovered_set(d)
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
                "reason": f"""CASE WHEN c.will_retry = 1 AND r.status <> {PENDING} THEN 'superseded'
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
                   lease_expires_at, heartbeat_at, retry_count, max_retries,
                   unique_key, unique_scope, {other_holder("work_items")} AS holder,
                   {_decisions(d, fail_sql)}{top_sequence}
            FROM work_items WHERE ctid = ANY(%s::tid[])
        ), c AS ({_superseded("c0")}), recovered AS (
            UPDATE work_items AS w SET {set_sql}
            FROM c
            WHERE w.ctid = c.ctid AND w.lease_token = c.lease_token
            RETURNING w.work_item_id, w.status, w.retry_count, w.error_message,
                      w.queue_name, w.updated_at, w.has_dependents
        ){checkpoints_sql}
        SELECT count(*) FILTER (WHERE status = {PENDING}) AS requeued,
               count(*) FILTER (WHERE status <> {PENDING}) AS failed,
               -- Failed items that others depend on: the service settles them next.
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


def expired_candidates_sqlite(
    d: Dialect,
    fail_types: list[str],
    batch_size: int,
    *,
    exclude: list[str] | None = None,
    only: str | None = None,
) -> Statement:
    """SQLite, step 1: the expired rows and their decisions (the IMMEDIATE transaction
    holds the only write lock, so nothing changes before step 2)."""
    fail_sql, fail_params = d.in_list("work_type", fail_types) if fail_types else ("0 = 1", [])
    picked, picked_params = _picked(d, exclude or [], only)
    sql = f"""
        WITH c0 AS (
            SELECT work_item_id, task_id, work_type, lease_holder, lease_token, lease_expires_at,
                   heartbeat_at, retry_count, max_retries, unique_key, unique_scope,
                   {other_holder("work_items")} AS holder, {_decisions(d, fail_sql)}
            FROM work_items
            WHERE status = {IN_PROGRESS} AND lease_expires_at < {d.now} {picked}
            ORDER BY lease_expires_at
            LIMIT %s
        )
        {_superseded("c0")}
    """
    return sql, [*fail_params, *fail_params, *picked_params, batch_size]


def recover_candidates_sqlite(d: Dialect, candidates: list[dict[str, Any]]) -> Statement:
    """SQLite, step 2: recover the candidates, re-checking status, expiry and token."""
    set_sql, set_params = _recovered_set(d)
    columns = (
        "work_item_id",
        "lease_token",
        "will_retry",
        "fail_policy",
        "timed_out",
        "cap_seconds",
        "superseded_by",
    )
    values = ", ".join([f"({', '.join(['%s'] * len(columns))})"] * len(candidates))
    params = [row[column] for row in candidates for column in columns]
    sql = f"""
        WITH c({", ".join(columns)}) AS (VALUES {values})
        UPDATE work_items AS w SET {set_sql}
        FROM c
        WHERE w.work_item_id = c.work_item_id AND w.lease_token = c.lease_token
          AND w.status = {IN_PROGRESS} AND w.lease_expires_at < {d.now}
        RETURNING work_item_id, status, retry_count, error_message, updated_at, has_dependents
    """
    return sql, [*params, *set_params]
