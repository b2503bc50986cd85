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
    """PostgreSQL: renew many leases in one statement.

    A lease with more than `extend_below` seconds left keeps its expiry and
    only records the heartbeat: an UPDATE that leaves the indexed expiry alone
    can be a HOT update (no index writes).
    """
    sql = f"""
        UPDATE work_items AS w
        SET lease_expires_at = CASE
                WHEN w.lease_expires_at < {d.now} + make_interval(secs => v.below)
                THEN LEAST({d.now} + make_interval(secs => v.duration), w.lease_deadline_at)
                ELSE w.lease_expires_at END,
            heartbeat_at = {d.now}, updated_at = {d.now},
            progress_at = CASE WHEN v.age IS NULL THEN w.progress_at
                               ELSE {d.now} - make_interval(secs => v.age) END
        FROM unnest(%s::text[], %s::bigint[], %s::float8[], %s::float8[], %s::float8[])
             AS v(id, token, duration, below, age)
        WHERE w.work_item_id = v.id AND {fence("w", token="v.token")}
          AND w.lease_expires_at > {d.now}
        RETURNING w.work_item_id, w.lease_token, w.lease_expires_at
    """
    params: list[Any] = [
        [r.work_item_id for r in renewals],
        [r.token for r in renewals],
        [r.duration for r in renewals],
        [r.extend_below for r in renewals],
        [r.progress_age for r in renewals],
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
