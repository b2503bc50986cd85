"""Which pending rows a claim takes: one walk of the claim index, or one branch per work type.

A claim takes pending, available, unblocked items its filters allow and no
pause holds back, in claim order (`limits.CLAIM_ORDER`), locking them with
`SKIP LOCKED` on PostgreSQL so concurrent claimers never pick the same row.

The plain claim walks `work_items_claim_idx` in claim order and stops after
the batch. A claim filtered to some work types checks the range of them on
the index entry (`_range`), so items of other types cost an index entry each
but no table read. That walk is still long when many pending items of types
the worker does not serve come first: a backlog of other types costs every
claim a walk past it, and every idle worker woken by an enqueue pays it.

`by_type` (PostgreSQL, a claim filtered to at most `MAX_BRANCHES` work
types): the claim reads each type on its own from `work_items_claim_type_idx`
(the claim index led by `work_type`): one branch per type, each walking its
type's items in claim order, locking with `SKIP LOCKED`, and stopping after
`n` rows; the branches' rows are sorted by claim order and the first `n`
claimed. Types paused as a whole are left out before any branch runs, so a
paused type's backlog is never walked. The price: the branches lock up to `n`
rows each, and rows beyond the first `n` stay locked (skipped by other
claimers) until the claim's transaction ends, a few milliseconds later. That
is free while the types have few claimable items and up to (types - 1) x `n`
extra row locks while several have many; the walk is the better read then,
since it stops after the batch. The caller picks (`leasing.services.claim_shape`:
branches after a claim that came back short, the walk after a full one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..states import WorkItemStatus
from .limits import AVAILABLE_AT, CLAIM_ORDER, QUEUE, WORK_TYPE, Limits, room_cte
from .pauses import not_paused
from .runner import Statement
from .terms import ClaimFilters

PENDING = f"'{WorkItemStatus.PENDING.value}'"

if TYPE_CHECKING:
    from ..storage.base import Storage

# The most work types a claim reads one branch each for.
MAX_BRANCHES = 64


def where(
    d: Storage, filters: ClaimFilters, *, skip: tuple[str, ...] = (), ahead_s: float = 0.0
) -> Statement:
    """Which rows a claim may take: pending, available, allowed by its filters, not paused.

    `skip`: filters the caller applies itself (a branch's `work_type`).
    `ahead_s`: also the rows that become available within so many seconds.
    """
    clauses: list[str] = []
    params: list[Any] = []
    available = f"{AVAILABLE_AT} <= {d.now}"
    if filters.settled_s > 0 or ahead_s:
        available = f"{AVAILABLE_AT} <= {d.clock()}"
        params.append(d.offset(ahead_s - filters.settled_s))
    for column, values in (
        ("work_type", filters.work_types),
        ("queue_name", filters.queues),
        ("task_id", filters.task_ids),
    ):
        if values is None or column in skip:
            continue
        clause, clause_params = d.in_list(column, list(values))
        clauses.append(f"AND {clause}")
        params += clause_params
        if column != "task_id":
            clause, clause_params = d.claim_range(column, values)
            if clause:
                clauses.append(f"AND {clause}")
                params += clause_params
    if filters.exclude_ids:
        clause, clause_params = d.in_list("work_item_id", list(filters.exclude_ids))
        clauses.append(f"AND NOT ({clause})")
        params += clause_params
    sql = f"""
        status = {PENDING} AND dependencies_left = 0 AND {available}
        {" ".join(clauses)} AND {not_paused(d)}
    """
    return sql, params


def plain_candidates(
    d: Storage, filters: ClaimFilters, n: int, *, columns: str = "work_item_id"
) -> Statement:
    """The ids (or `columns`) of up to `n` claimable rows in claim order.

    One walk of the claim index.
    """
    condition, params = where(d, filters)
    sql = f"""
        SELECT {columns} FROM work_items WHERE {condition}
        ORDER BY {CLAIM_ORDER}
        LIMIT %s
    """
    return sql, [*params, n]


def due(d: Storage, filters: ClaimFilters, within_s: float, limits: Limits) -> Statement:
    """One row if a row these filters claim is available within `within_s` seconds and
    held back by neither a pause nor a concurrency limit that is full now; else none.

    What a draining worker (`runworker --burst`) with nothing in flight waits
    for: a full limit's in-flight items are then other processes', so what it
    holds back is not this worker's to wait for. The full keys are read as a
    limited claim's fallback walk reads them (`limits.limited_candidates`).
    """
    condition, params = where(d, filters, ahead_s=within_s)
    if not limits:
        return f"SELECT 1 AS due FROM work_items WHERE {condition} LIMIT 1", params
    room, room_params = room_cte(limits, after_done=False)
    sql = f"""
        WITH {room}
        SELECT 1 AS due FROM work_items WHERE {condition} AND NOT EXISTS (
            SELECT 1 FROM room WHERE room.room = 0 AND (
                (room.kind = '{QUEUE}' AND room.name = work_items.queue_name)
                OR (room.kind = '{WORK_TYPE}' AND room.name = work_items.work_type)))
        LIMIT 1
    """
    return sql, [*room_params, *params]
