"""SQLite's statements: one writer at a time, so a compare-and-swap needs no row locks.

IMMEDIATE transactions take the database's only write lock up front: a claim
is an UPDATE of the candidates that re-checks their status, the sweep reads
its candidates and updates them inside one transaction, and multi-row
INSERTs stay under SQLite's bound-variable limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...sql.candidates import plain_candidates, where
from ...sql.checkpoints import COLUMNS as CHECKPOINT_COLUMNS
from ...sql.checkpoints import ERROR_BOUNDARY, resume_point, tasks_past_retention
from ...sql.fairness import Fairness, fair_candidates
from ...sql.limits import Limits, limited_candidates
from ...sql.new_items import COLUMNS, NEW_STATUS, RICH_COLUMNS, NewItem, RichRow
from ...sql.recovery import decisions, pick_filter, recovered_set, superseded
from ...sql.renewals import Renewal
from ...sql.rollups import finished_range
from ...sql.runner import Statement
from ...sql.terms import ClaimFilters, LeaseTerms
from ...sql.unique import other_holder
from ...sql.work_items import IN_PROGRESS, LEASE_COLUMNS, NO_LIMITS, claim_set, fence
from ...transitions import CLAIM

if TYPE_CHECKING:
    from . import SQLiteStorage

# SQLite binds at most 32766 parameters; a row binds ten.
ROWS_PER_INSERT = 3000


def insert(d: SQLiteStorage, items: list[NewItem]) -> Statement:
    """One multi-row INSERT (at most `ROWS_PER_INSERT` rows)."""
    values = ", ".join(
        f"(%s, %s, %s, {NEW_STATUS}, %s, 0, 0, %s, %s, %s, %s, %s, %s, {d.now}, {d.now})"
        for _ in items
    )
    params: list[Any] = []
    for i in items:
        params += [
            i.work_item_id,
            i.task_id,
            i.work_type,
            i.priority,
            i.max_retries,
            d.datetime_param(i.run_after),
            i.queue_name,
            i.input_json,
            i.rate_key,
            i.fairness_key,
        ]
    sql = (
        f"INSERT INTO work_items ({COLUMNS}, created_at, updated_at) VALUES {values} "
        "RETURNING work_item_id, created_at"
    )
    return sql, params


# SQLite binds at most 32766 parameters; a rich row binds seventeen.
RICH_ROWS_PER_INSERT = 1900


def insert_rich(
    d: SQLiteStorage, rows: list[RichRow], on_conflict: str, returning: str
) -> Statement:
    """Items with unique keys or dependencies, as one multi-row INSERT (at most
    `RICH_ROWS_PER_INSERT` rows)."""
    values = ", ".join(
        f"(%s, %s, %s, {NEW_STATUS}, %s, 0, 0, %s, %s, %s, %s, %s, %s, "
        f"%s, %s, CASE WHEN %s IS NULL THEN NULL ELSE {d.clock()} END, %s, %s, %s, "
        f"{d.now}, {d.now})"
        for _ in rows
    )
    params: list[Any] = []
    for r in rows:
        i = r.item
        period = None if i.unique_seconds is None else d.offset(i.unique_seconds)
        params += [
            i.work_item_id,
            i.task_id,
            i.work_type,
            i.priority,
            i.max_retries,
            d.datetime_param(i.run_after),
            i.queue_name,
            i.input_json,
            i.rate_key,
            i.fairness_key,
            i.unique_key,
            i.unique_scope,
            period,
            period,
            r.dependencies_left,
            r.has_dependents,
            i.on_dependency_failure,
        ]
    sql = (
        f"INSERT INTO work_items ({RICH_COLUMNS}, created_at, updated_at) VALUES {values} "
        f"{on_conflict} RETURNING {returning}"
    )
    return sql, params


def renew_lazily(d: SQLiteStorage, holder: str, renewal: Renewal) -> Statement:
    """Renew one lease: extended only when less than `extend_below` seconds are left."""
    progress = "" if renewal.progress_age is None else f", progress_at = {d.clock()}"
    sql = f"""
        UPDATE work_items
        SET lease_expires_at = CASE
                WHEN lease_expires_at < {d.clock()}
                THEN {d.earliest(d.clock(), "lease_deadline_at")}
                ELSE lease_expires_at END,
            heartbeat_at = {d.now}, updated_at = {d.now}{progress}
        WHERE work_item_id = %s AND {fence()} AND lease_expires_at > {d.now}
        RETURNING work_item_id, lease_token, lease_expires_at
    """
    params: list[Any] = [d.offset(renewal.extend_below), d.offset(renewal.duration)]
    if renewal.progress_age is not None:
        params.append(d.offset(-renewal.progress_age))
    return sql, [*params, renewal.work_item_id, holder, renewal.token]


def append_error_boundaries(
    d: SQLiteStorage, rows: list[tuple[str, str, str, str]], metadata_json: str
) -> Statement:
    """One `error_boundary` checkpoint per (checkpoint id, task, item, snapshot) row.

    Several rows of one task are numbered in the given order.
    """
    values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(rows))
    params: list[Any] = []
    for index, (checkpoint_id, task_id, item_id, snapshot) in enumerate(rows):
        params += [checkpoint_id, task_id, item_id, snapshot, index]
    sql = f"""
        WITH v(checkpoint_id, task_id, work_item_id, snapshot, ord) AS (VALUES {values})
        INSERT INTO checkpoints ({CHECKPOINT_COLUMNS})
        SELECT v.checkpoint_id, v.task_id, v.work_item_id, {ERROR_BOUNDARY},
               COALESCE((SELECT MAX(sequence_number) FROM checkpoints AS existing
                         WHERE existing.task_id = v.task_id), 0)
               + row_number() OVER (PARTITION BY v.task_id ORDER BY v.ord),
               v.snapshot, %s, {d.now}
        FROM v
        RETURNING checkpoint_id
    """
    return sql, [*params, metadata_json]


def claim(
    d: SQLiteStorage,
    holder: str,
    n: int,
    terms: LeaseTerms,
    filters: ClaimFilters,
    limits: Limits = NO_LIMITS,
    *,
    fairness: Fairness | None = None,
) -> Statement:
    """Claim up to `n` items in claim order; returns their lease columns.

    Paused queues and work types are skipped; no limited queue or type goes
    past its limit (the count in the statement is exact: one writer at a time).
    With `fairness`, in turn order, each row followed by its key and NULL (an
    UPDATE cannot return the key's place: `next_cursors` takes code-point order).
    """
    # One writer at a time; the status re-check makes the UPDATE a
    # compare-and-swap even if the subquery saw an older row.
    set_sql, set_params = claim_set(d, holder, terms)
    if fairness is not None:
        condition, condition_params = where(d, filters)
        ctes, cte_params = fair_candidates(d, condition, condition_params, n, fairness, limits)
        sql = f"""
            WITH {ctes}
            UPDATE work_items SET {set_sql}
            WHERE work_item_id IN (SELECT work_item_id FROM candidate) AND {CLAIM.leaves()}
            RETURNING {", ".join(LEASE_COLUMNS)}, fairness_key, NULL
        """
        return sql, [*cte_params, *set_params]
    if limits:
        condition, condition_params = where(d, filters)
        ctes, candidate_params = limited_candidates(d, condition, condition_params, n, limits)
        prefix, candidates = f"WITH {ctes}", "SELECT work_item_id FROM candidate"
        params = [*candidate_params, *set_params]
    else:
        candidates, candidate_params = plain_candidates(d, filters, n)
        prefix, params = "", [*set_params, *candidate_params]
    sql = f"""
        {prefix} UPDATE work_items SET {set_sql}
        WHERE work_item_id IN ({candidates}) AND {CLAIM.leaves()}
        RETURNING {", ".join(LEASE_COLUMNS)}
    """
    return sql, params


def expired_candidates(
    d: SQLiteStorage,
    fail_types: list[str],
    batch_size: int,
    *,
    exclude: list[str] | None = None,
    only: str | None = None,
) -> Statement:
    """Step 1: the expired rows and their decisions (the IMMEDIATE transaction
    holds the only write lock, so nothing changes before step 2)."""
    fail_sql, fail_params = d.in_list("work_type", fail_types) if fail_types else ("0 = 1", [])
    picked, picked_params = pick_filter(d, exclude or [], only)
    sql = f"""
        WITH c0 AS (
            SELECT work_item_id, task_id, work_type, lease_holder, lease_token, lease_expires_at,
                   heartbeat_at, lease_acquired_at, retry_count, max_retries, unique_key,
                   unique_scope,
                   {other_holder("work_items")} AS holder, {decisions(d, fail_sql)}
            FROM work_items
            WHERE status = {IN_PROGRESS} AND lease_expires_at < {d.now} {picked}
            ORDER BY lease_expires_at
            LIMIT %s
        )
        {superseded("c0")}
    """
    return sql, [*fail_params, *fail_params, *picked_params, batch_size]


def recover_candidates(d: SQLiteStorage, candidates: list[dict[str, Any]]) -> Statement:
    """Step 2: recover the candidates, re-checking status, expiry and token."""
    set_sql, set_params = recovered_set(d)
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


def trim_checkpoints(d: SQLiteStorage, retention: int, since: Any) -> Statement:
    """Delete each task's checkpoints beyond its newest `retention` (`tasks_past_retention`)."""
    tasks, params = tasks_past_retention(d, retention, since)
    ranked = f"""
        SELECT checkpoint_id FROM (
            SELECT checkpoint_id,
                   row_number() OVER (PARTITION BY task_id
                                      ORDER BY sequence_number DESC) AS newest_first
            FROM checkpoints WHERE task_id IN ({tasks})
        ) ranked
        WHERE newest_first > %s
    """
    sql = f"""
        DELETE FROM checkpoints
        WHERE checkpoint_id IN ({ranked}) AND NOT {resume_point("checkpoints")}
        RETURNING checkpoint_id
    """
    return sql, [*params, retention]


def finished_items(d: SQLiteStorage, start: Any, end: Any) -> Statement:
    """One row per item finished in [start, end), for `SQLiteStorage.finished_groups`."""
    where, params = finished_range(d, start, end)
    sql = f"""
        SELECT completed_at, queue_name, work_type, status, retry_count, lease_acquired_at
        FROM work_items WHERE {where}
    """
    return sql, params
