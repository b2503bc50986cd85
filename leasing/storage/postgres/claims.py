"""PostgreSQL's claims: candidates locked with SKIP LOCKED, batch completion, advisory locks.

A claim's candidates are locked with SKIP LOCKED, so concurrent claimers never
pick the same row and never wait for one another, and updated by their
address (`ctid`): a row this statement locked cannot move. A busy worker
completes what its handlers finished and claims its next batch in one
statement (`complete_and_claim`). The advisory locks here serialize what a
row lock cannot: the claims of a limited queue or type (`lock_limits`), the
enqueues of a period-scoped unique key, the numbering of a task's checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ...sql.candidates import MAX_BRANCHES, plain_candidates, where
from ...sql.dependencies import EDGES
from ...sql.fairness import Fairness, fair_candidates
from ...sql.limits import AVAILABLE_AT, CLAIM_ORDER, Limits, limited_candidates
from ...sql.new_items import NOTIFY_CHANNEL
from ...sql.pauses import ACTIVE_KEYS, WORK_TYPE
from ...sql.runner import Statement, dump_json
from ...sql.terms import ClaimFilters, LeaseTerms
from ...sql.work_items import (
    LEASE_COLUMNS,
    NO_LIMITS,
    claim_set,
    completed_set,
    fence,
    returning,
)

if TYPE_CHECKING:
    from . import PostgresStorage


def claim(
    d: PostgresStorage,
    holder: str,
    n: int,
    terms: LeaseTerms,
    filters: ClaimFilters,
    limits: Limits = NO_LIMITS,
    *,
    by_type: bool = False,
    fairness: Fairness | None = None,
) -> Statement:
    """Claim up to `n` items in claim order; returns their lease columns.

    Paused queues and work types are skipped; with `limits` (run after
    `lock_limits`, in one transaction) no limited queue or type goes past its limit.
    With `fairness`, in turn order, each row followed by its key and the key's place.
    """
    ctes, params = claim_ctes(
        d, holder, n, terms, filters, limits, by_type=by_type, fairness=fairness
    )
    if fairness is None:
        sql = f"WITH {ctes} SELECT {', '.join(LEASE_COLUMNS)} FROM claimed"
    else:
        sql = f"""
            WITH RECURSIVE {ctes}
            SELECT {returning("claimed")}, candidate.fairness_key, candidate.pos
            FROM claimed JOIN candidate ON candidate.work_item_id = claimed.work_item_id
        """
    return d.in_claim_order(sql), params


def claim_ctes(
    d: PostgresStorage,
    holder: str,
    n: int,
    terms: LeaseTerms,
    filters: ClaimFilters,
    limits: Limits = NO_LIMITS,
    *,
    after_done: bool = False,
    by_type: bool = False,
    fairness: Fairness | None = None,
) -> Statement:
    """CTEs `candidate` and `claimed` (the claimed rows' lease columns).

    The candidates are locked with SKIP LOCKED, so concurrent claimers never
    pick the same row and never wait for one another. With `limits` the
    candidates are picked by `leasing.sql.limits` (the caller holds their
    advisory locks); otherwise by `leasing.sql.candidates` (`by_type`: one
    branch per work type where it can).
    """
    if fairness is not None:
        # The caller's WITH says RECURSIVE (`leasing.sql.fairness`).
        condition, condition_params = where(d, filters)
        candidates, candidate_params = fair_candidates(
            d, condition, condition_params, n, fairness, limits, after_done=after_done
        )
        candidates = candidates.removeprefix("RECURSIVE ")
    elif limits:
        condition, condition_params = where(d, filters)
        candidates, candidate_params = limited_candidates(
            d, condition, condition_params, n, limits, after_done=after_done
        )
    else:
        candidates, candidate_params = locked_candidates(d, filters, n, by_type=by_type)
    set_sql, set_params = claim_set(d, holder, terms)
    # The UPDATE finds the candidates by their address (a row this statement
    # locked cannot move): a TID scan whatever the statistics say. Joined to
    # the candidates by id, it was planned from the statistics: after an
    # autovacuum ANALYZE that ran while a burst was still being enqueued (it
    # counted 0 rows), the planner took the table for one row, made a walk of
    # the whole primary key the outer side of a nested loop (seconds a claim),
    # and with the ids as an array it walked `work_items_created_idx`.
    sql = f"""
        {candidates},
        claimed AS (
            UPDATE work_items SET {set_sql}
            WHERE work_items.ctid = ANY(ARRAY(SELECT ctid FROM candidate))
            RETURNING {returning("work_items")}
        )
    """
    return sql, [*candidate_params, *set_params]


def _complete_batch(d: PostgresStorage) -> str:
    """Complete held leases given as a JSON list of [id, token, output] and the holder.

    One JSON text, not three arrays: the driver quotes it in C, where it
    would dump arrays element by element in Python.

    Fenced per row; returns the (id, token) of each item it completed. An
    item something depends on is left alone (`NOT has_dependents`): its
    completion must reach its dependents in the same transaction, which
    `leasing.services.dependencies` does.
    """
    return f"""
        UPDATE work_items AS w SET {completed_set(d, "v.output::jsonb")}
        FROM (
            SELECT e->>0 AS id, (e->>1)::bigint AS token, e->>2 AS output
            FROM json_array_elements(%s::json) AS e
        ) AS v
        WHERE w.work_item_id = v.id AND {fence("w", token="v.token")} AND NOT w.has_dependents
        RETURNING w.work_item_id, w.lease_token, w.queue_name, w.work_type
    """


def complete_batch(
    d: PostgresStorage, holder: str, done: list[tuple[str, int, str | None]]
) -> Statement:
    """Complete many (id, token, output JSON) in one statement."""
    return _complete_batch(d), [dump_json(done), holder]


def complete_and_claim(
    d: PostgresStorage,
    holder: str,
    done: list[tuple[str, int, str | None]],
    n: int,
    terms: LeaseTerms,
    filters: ClaimFilters,
    limits: Limits = NO_LIMITS,
    *,
    by_type: bool = False,
    fairness: Fairness | None = None,
) -> Statement:
    """Complete finished items and claim new ones in one statement.

    Both are data-modifying CTEs on disjoint rows (held `in_progress` vs
    `pending`), so a busy worker pays one round trip per batch. The claim is
    `claim_ctes`, gates included: the limits' in-flight counts take off the
    items this statement completes (its snapshot still sees them in flight).
    """
    ctes, claim_params = claim_ctes(
        d, holder, n, terms, filters, limits, after_done=True, by_type=by_type, fairness=fairness
    )
    done_columns = ", ".join(
        c if c in ("work_item_id", "lease_token") else "NULL" for c in LEASE_COLUMNS
    )
    if fairness is None:
        sql = f"""
            WITH done AS ({_complete_batch(d)}), {ctes}
            SELECT {", ".join(LEASE_COLUMNS)}, 'claimed' AS kind FROM claimed
            UNION ALL
            SELECT {done_columns}, 'done' FROM done
        """
    else:
        sql = f"""
            WITH RECURSIVE done AS ({_complete_batch(d)}), {ctes}
            SELECT {returning("claimed")}, candidate.fairness_key, candidate.pos,
                   'claimed' AS kind
            FROM claimed JOIN candidate ON candidate.work_item_id = claimed.work_item_id
            UNION ALL
            SELECT {done_columns}, NULL, NULL, 'done' FROM done
        """
    _, done_params = complete_batch(d, holder, done)
    return d.in_claim_order(sql), [*done_params, *claim_params]


def claim_range(column: str, values: Sequence[str]) -> Statement:
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


def type_branches(filters: ClaimFilters) -> bool:
    """Whether a claim with these filters can read one branch per work type."""
    types = filters.work_types
    return types is not None and len(types) <= MAX_BRANCHES


def locked_candidates(
    d: PostgresStorage, filters: ClaimFilters, n: int, *, by_type: bool = False
) -> Statement:
    """The CTE `candidate(work_item_id, ctid)`: up to `n` claimable rows, locked (PostgreSQL).

    `by_type`: one branch per work type, if the filters allow it. The claim
    updates the rows by their address (`ctid`): a row this statement locked
    cannot move.
    """
    if by_type and type_branches(filters):
        return _branched(d, filters, n)
    candidates, params = plain_candidates(d, filters, n, columns="work_item_id, ctid")
    return f"candidate AS ({candidates} {d.skip_locked()})", params


def _branched(d: PostgresStorage, filters: ClaimFilters, n: int) -> Statement:
    # A branch's type is written as a range of one, and its order is led by
    # the type: with `work_type = t` the planner drops the type from the
    # order (it is constant) and, with its statistics one way, walks the
    # claim index instead (work_type is its last key, so it reads every
    # entry). Only the type-led index gives this order without a sort, and
    # a claim runs with sorts off (`PostgresStorage.in_claim_order`).
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
                {d.skip_locked()}
            ) AS c
            WHERE NOT ({WORK_TYPE} || ':' || t.work_type = ANY(ARRAY({ACTIVE_KEYS})))
            ORDER BY c.priority DESC, c.available_at, c.created_at, c.work_item_id
            LIMIT %s
        )
    """
    return sql, [list(filters.work_types or ()), *params, n, n]


def lock_limits(limits: Limits) -> Statement:
    """The advisory lock of each limited key, in code-point order (no cycles).

    Also switches JIT off for the rest of the transaction (`set_config(...,
    true)` is SET LOCAL): the limited claim sorts a few rows for its window
    functions, and with sorts discouraged (`PostgresStorage.in_claim_order`) its cost
    estimate crosses the JIT thresholds, and compiling costs seconds.
    """
    sql = """
        SELECT set_config('jit', 'off', true) AS jit,
               count(pg_advisory_xact_lock(hashtextextended('leasing.limit:' || k, 0)))
                   AS locked
        FROM (SELECT k FROM unnest(%s::text[]) AS u(k) ORDER BY k COLLATE "C") AS o
    """
    return sql, [sorted(set(limits.lock_keys()))]


def lock_period_keys(keys: list[str]) -> Statement:
    """Take the advisory lock of each period key, in code-point order.

    Released at commit or rollback. Sorted so that two batches that share
    keys never wait for each other in a cycle.
    """
    sql = """
        SELECT count(pg_advisory_xact_lock(hashtextextended('leasing.unique:' || k, 0)))
            AS locked
        FROM (SELECT k FROM unnest(%s::text[]) AS u(k) ORDER BY k COLLATE "C") AS o
    """
    return sql, [sorted(set(keys))]


def task_locks(tasks: str) -> str:
    """A scalar subquery taking the checkpoint lock of each task of `tasks`.

    `tasks` is a query with one column `t`; the locks are taken in its order.
    Every holder of several task locks takes them in one (sorted) order, so
    two of them never wait for each other in a cycle.
    """
    return f"""(
        SELECT count(pg_advisory_xact_lock(hashtextextended('leasing.checkpoints:' || t, 0)))
        FROM ({tasks}) AS o
    )"""


def lock_tasks(task_ids: list[str]) -> Statement:
    """Take the checkpoint locks of these tasks, in the given order."""
    ordered = "SELECT t FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n"
    return f"SELECT {task_locks(ordered)} AS locked", [task_ids]


def lock_dependents(d: PostgresStorage, ids: list[str]) -> Statement:
    """Row-lock the dependents of these items, in id order."""
    condition, params = d.one_of("dependency_id", ids)
    sql = f"""
        SELECT work_item_id FROM work_items
        WHERE work_item_id IN (SELECT dependent_id FROM {EDGES} WHERE {condition})
        ORDER BY work_item_id
        FOR NO KEY UPDATE
    """
    return sql, params


def notify(queue_names: Iterable[str]) -> Statement:
    """Wake idle workers of these queues (delivered when the transaction commits)."""
    return (
        "SELECT pg_notify(%s, q) FROM unnest(%s::text[]) AS q",
        [NOTIFY_CHANNEL, sorted(set(queue_names))],
    )
