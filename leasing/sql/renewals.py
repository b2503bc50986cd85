"""Statements that renew leases: never past a lease's deadline, never a lease that ran out.

A renewal carries the lease fence and `lease_expires_at > now`, so a late
heartbeat never resurrects an expired lease, and its new expiry is the earlier
of now + duration and the lease's deadline (`lease_deadline_at`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .runner import Statement
from .work_items import fence

if TYPE_CHECKING:
    from ..storage.base import Storage


def renew_one(
    d: Storage,
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
