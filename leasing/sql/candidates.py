"""Which pending rows a claim takes: one walk of the claim index, or one branch per work type.

A claim takes pending, available, unblocked items its filters allow and no
pause holds back, in claim order (`limits.CLAIM_ORDER`), locking them with
`SKIP LOCKED` on PostgreSQL so concurrent claimers never pick the same row.

The plain claim walks `work_items_claim_idx` in claim order and stops after
the batch. A claim filtered to some work types checks the range of them on
the index entry (`_range`), so items of other types cost an index entry each
but no table read. That walk is still long when many pending items of types
the worker does not serve come first: 78,000 of them cost each claim about
11 ms on the 2-CPU bench host, and every idle worker woken by an enqueue pays
it (`make bench-dashboard` with a trickle of work).

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

from typing import Any

from ..states import WorkItemStatus
from .dialect import Dialect
from .limits import AVAILABLE_AT, CLAIM_ORDER
from .pauses import ACTIVE_KEYS, WORK_TYPE, not_paused
from .runner import Statement
from .terms import ClaimFilters

PENDING = f"'{WorkItemStatus.PENDING.value}'"

# The most work types a claim reads one branch each for.
MAX_BRANCHES = 64


def where(d: Dialect, filters: ClaimFilters, *, skip: tuple[str, ...] = ()) -> Statement:
    """Which rows a claim may take: pending, available, allowed by its filters, not paused.

    `skip`: filters the caller applies itself (a branch's `work_type`).
    """
    clauses: list[str] = []
    params: list[Any] = []
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
        if d.is_postgres and column != "task_id":
            clause, clause_params = _range(column, values)
            clauses.append(f"AND {clause}")
            params += clause_params
    sql = f"""
        status = {PENDING} AND dependencies_left = 0 AND {AVAILABLE_AT} <= {d.now}
        {" ".join(clauses)} AND {not_paused(d)}
    """
    return sql, params


def _range(column: str, values: tuple[str, ...]) -> Statement:
    """`column BETWEEN` the least and the greatest of `values`, in the database's collation.

    Implied by `column = ANY(values)`, but unlike it usable on a trailing
    column of the claim index without giving up its order (PostgreSQL 15): a
    claim filtered to some queues or work types then skips the items of the
    others outside that range on the index entry, without reading their rows.
    A worker serving one type or queue, or types that share a prefix, walks
    only its own items; one serving types spread across the alphabet still
    reads the rows of those in between.
    """
    marks = ", ".join(["%s"] * len(values))
    return f"{column} BETWEEN LEAST({marks}) AND GREATEST({marks})", [*values, *values]


def type_branches(d: Dialect, filters: ClaimFilters) -> bool:
    """Whether a claim with these filters can read one branch per work type."""
    types = filters.work_types
    return d.is_postgres and types is not None and len(types) <= MAX_BRANCHES


def locked_candidates(
    d: Dialect, filters: ClaimFilters, n: int, *, by_type: bool = False
) -> Statement:
    """The CTE `candidate(work_item_id, ctid)`: up to `n` claimable rows, locked (PostgreSQL).

    `by_type`: one branch per work type, if the filters allow it. The claim
    updates the rows by their address (`ctid`): a row this statement locked
    cannot move.
    """
    if by_type and type_branches(d, filters):
        return _branched(d, filters, n)
    candidates, params = plain_candidates(d, filters, n, columns="work_item_id, ctid")
    return f"candidate AS ({candidates} {d.lock_skip_locked()})", params


def plain_candidates(
    d: Dialect, filters: ClaimFilters, n: int, *, columns: str = "work_item_id"
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


def _branched(d: Dialect, filters: ClaimFilters, n: int) -> Statement:
    # A branch's type is written as a range of one, and its order is led by
    # the type: with `work_type = t` the planner drops the type from the
    # order (it is constant) and, with its statistics one way, walks the
    # claim index instead (work_type is its last key, so it reads every
    # entry). Only the type-led index gives this order without a sort, and
    # a claim runs with sorts off (`Dialect.in_claim_order`).
    condition, params = where(d, filters, skip=("work_type",))
    sql = f"""
        candidate AS (
            SELECT c.work_item_id, c.ctid
            FROM unnest(%s::text[]) AS t(work_type)
            CROSS JOIN LATERAL (
                SELECT work_item_id, ctid, priority, {AVAILABLE_AT} AS available_at, created_at
                FROM work_items
                WHERE work_items.work_type >= t.work_type
                  AND work_items.work_type <= t.work_type AND {condition}
                ORDER BY work_items.work_type, {CLAIM_ORDER}
                LIMIT %s
                {d.lock_skip_locked()}
            ) AS c
            WHERE NOT ({WORK_TYPE} || ':' || t.work_type = ANY(ARRAY({ACTIVE_KEYS})))
            ORDER BY c.priority DESC, c.available_at, c.created_at, c.work_item_id
            LIMIT %s
        )
    """
    return sql, [list(filters.work_types or ()), *params, n, n]
