"""Statements that renew leases: never past a lease's deadline, never a lease that ran out.

A renewal carries the lease fence and `lease_expires_at > now`, so a late
heartbeat never resurrects an expired lease, and its new expiry is the earlier
of now + duration and the lease's deadline (`lease_deadline_at`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .dialect import Dialect
from .runner import Statement
from .work_items import fence


def renew_one(
    d: Dialect,
    holder: str,
    item_id: str,
    token: int,
    duration: float,
    progress_age: float | None,
) -> Statement:
    """Extend a live lease to now + duration, never past its deadline."""
    progress = "" if progress_age is None else f", progress_at = {d.clock()}"
    sql = f"""
        UPDATE work_items
        SET lease_expires_at = {d.earliest(d.clock(), "lease_deadline_at")},
            heartbeat_at = {d.now}, updated_at = {d.now}{progress}
        WHERE work_item_id = %s AND {fence()} AND lease_expires_at > {d.now}
        RETURNING lease_expires_at
    """
    params: list[Any] = [d.offset(duration)]
    if progress_age is not None:
        params.append(d.offset(-progress_age))
    return sql, [*params, item_id, holder, token]


@dataclass(frozen=True, slots=True)
class Renewal:
    """One lease to renew: extended only when less than `extend_below` seconds are left."""

    work_item_id: str
    token: int
    duration: float
    extend_below: float
    progress_age: float | None = None


def renew_batch_postgres(d: Dialect, holder: str, renewals: list[Renewal]) -> Statement:
    """PostgreSQL: renew many leases in one statement; rows `(id, token, expiry, lost)`.

    A lease with more than `extend_below` seconds left keeps its expiry and
    only records the heartbeat: an UPDATE that leaves the indexed expiry alone
    can be a HOT update (no index writes).

    The rows are locked first, skipping any that another transaction holds
    (the process's own completion of a finished item, a checkpoint's fence).
    A renewal that waited there, holding the rest of its batch, deadlocked
    with a completion locking the same rows in another order: both waited a
    second for the deadlock detector, and the renewal round failed. The rows
    come back renewed, or `lost` when the statement's snapshot shows the lease
    no longer live (expired, past its deadline, moved on); a skipped lease is
    neither, and the next round renews it if it is still held. Every join
    follows a key or a row address, so stale statistics (a claim moments ago)
    cannot turn one into a loop over the whole batch.
    """

    def live(token: str) -> str:
        return f"{fence('w', token=token)} AND w.lease_expires_at > {d.now}"

    sql = f"""
        WITH v AS (
            SELECT * FROM unnest(%s::text[], %s::bigint[], %s::float8[], %s::float8[],
                                 %s::float8[]) AS v(id, token, duration, below, age)
        ), locked AS (
            SELECT w.ctid, v.token, v.duration, v.below, v.age
            FROM work_items AS w JOIN v ON w.work_item_id = v.id
            WHERE {live("v.token")}
            FOR NO KEY UPDATE OF w SKIP LOCKED
        ), renewed AS (
            -- A row locked by this statement cannot move: its address still holds.
            UPDATE work_items AS w
            SET lease_expires_at = CASE
                    WHEN w.lease_expires_at < {d.now} + make_interval(secs => l.below)
                    THEN LEAST({d.now} + make_interval(secs => l.duration), w.lease_deadline_at)
                    ELSE w.lease_expires_at END,
                heartbeat_at = {d.now}, updated_at = {d.now},
                progress_at = CASE WHEN l.age IS NULL THEN w.progress_at
                                   ELSE {d.now} - make_interval(secs => l.age) END
            FROM locked AS l
            WHERE w.ctid = l.ctid AND {live("l.token")}
            RETURNING w.work_item_id, w.lease_token, w.lease_expires_at
        )
        SELECT work_item_id, lease_token, lease_expires_at, FALSE AS lost FROM renewed
        UNION ALL
        SELECT v.id, v.token, NULL, TRUE FROM v
        WHERE NOT EXISTS (SELECT 1 FROM work_items AS w WHERE w.work_item_id = v.id
                          AND {live("v.token")})
    """
    params: list[Any] = [
        [r.work_item_id for r in renewals],
        [r.token for r in renewals],
        [r.duration for r in renewals],
        [r.extend_below for r in renewals],
        [r.progress_age for r in renewals],
        holder,
        holder,
        holder,
    ]
    return sql, params


def renew_lazily(d: Dialect, holder: str, renewal: Renewal) -> Statement:
    """SQLite: `renew_batch_postgres()` for one lease."""
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
