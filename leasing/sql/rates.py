"""Statements of rate limits: the claim's gate, the buckets' rows and the admitted items' claim.

A rate-limited claim (`leasing.services.rate_limits`) runs in one transaction:

1. `candidates`: up to `n` claimable items in claim order (locked with SKIP
   LOCKED on PostgreSQL, so concurrent claimers never pick the same row),
   past the gate: an item none of whose buckets (`queue:`, `work_type:`,
   `key:`) is closed (`next_at` after the database clock) is a candidate.
   The gate is an uncorrelated probe of the buckets' primary key per row: a
   waiting item is neither locked nor claimed, so it stays pending, costs no
   attempt and is never retried.
2. `ensure_buckets` / `lock_buckets`: the candidates' buckets, created if
   missing and row-locked in code-point order (two claimers never wait for
   each other in a cycle); the database clock read after the locks are held
   (`clock`) is the time the admission is decided at.
3. `save_bucket` and `claim_ids`: the buckets' new state and the claim of the
   admitted items, by id, re-checking that they are still pending.

Serializing on the bucket rows (not on a snapshot's count) keeps the limit
exact across every worker and host: a claimer that waited for a bucket's
lock reads the state its previous holder committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..transitions import CLAIM
from .candidates import where
from .limits import CLAIM_ORDER, Limits, limited_candidates
from .runner import Statement
from .terms import ClaimFilters, LeaseTerms
from .work_items import LEASE_COLUMNS, claim_set

if TYPE_CHECKING:
    from ..storage.base import Storage

BUCKETS = "leasing_rate_buckets"
# A candidate's buckets, as the claim reads them (`rate_key` NULL: no key bucket).
CANDIDATE_COLUMNS = "work_item_id, queue_name, work_type, rate_key"


def gate(d: Storage) -> str:
    """The claim's condition: none of the row's buckets is closed at the database clock."""
    return f"""NOT EXISTS (
        SELECT 1 FROM {BUCKETS} AS rb
        WHERE rb.bucket IN ('queue:' || work_items.queue_name,
                            'work_type:' || work_items.work_type,
                            'key:' || work_items.rate_key)
          AND rb.next_at > {d.epoch(d.now)})"""


def candidates(d: Storage, filters: ClaimFilters, n: int, limits: Limits) -> Statement:
    """Up to `n` claimable items past the gate, in claim order, with their buckets' names."""
    condition, params = where(d, filters)
    condition = f"{condition} AND {gate(d)}"
    if limits:
        ctes, cte_params = limited_candidates(d, condition, params, n, limits)
        sql = f"""
            WITH {ctes}
            SELECT {", ".join(f"w.{c}" for c in CANDIDATE_COLUMNS.split(", "))}
            FROM candidate AS c JOIN work_items AS w ON w.work_item_id = c.work_item_id
            ORDER BY w.priority DESC, COALESCE(w.run_after, w.created_at), w.created_at,
                     w.work_item_id
        """
        return d.in_claim_order(sql), cte_params
    sql = f"""
        SELECT {CANDIDATE_COLUMNS} FROM work_items WHERE {condition}
        ORDER BY {CLAIM_ORDER}
        LIMIT %s {d.skip_locked()}
    """
    return d.in_claim_order(sql), [*params, n]


def ensure_buckets(d: Storage, buckets: Sequence[str]) -> Statement:
    """Create the rows of these buckets (sorted) that do not exist yet."""
    values = ", ".join(f"(%s, 0, 0, 0, {d.now})" for _ in buckets)
    sql = f"""
        INSERT INTO {BUCKETS} (bucket, tat, next_at, admitted, updated_at) VALUES {values}
        ON CONFLICT (bucket) DO NOTHING
    """
    return sql, sorted(buckets)


def lock_buckets(d: Storage, buckets: Sequence[str]) -> Statement:
    """The rows of these buckets, locked in code-point order."""
    condition, params = d.one_of("bucket", list(buckets))
    sql = f"""
        SELECT bucket, tat, limit_count, period_seconds, burst FROM {BUCKETS}
        WHERE {condition} ORDER BY bucket {d.collate_c()} {d.row_lock("UPDATE")}
    """
    return sql, params


def clock(d: Storage) -> Statement:
    """The database clock, read when the statement runs, in seconds since the epoch."""
    return f"SELECT {d.epoch(d.wall_clock())} AS now", []


def save_bucket(d: Storage, bucket: str, tat: float, next_at: float, admitted: int) -> Statement:
    sql = f"""
        UPDATE {BUCKETS} SET tat = %s, next_at = %s, admitted = admitted + %s,
                             updated_at = {d.now}
        WHERE bucket = %s
    """
    return sql, [tat, next_at, admitted, bucket]


def claim_ids(d: Storage, holder: str, ids: Sequence[str], terms: LeaseTerms) -> Statement:
    """Claim these (locked, admitted) items; returns their lease columns."""
    set_sql, set_params = claim_set(d, holder, terms)
    condition, params = d.one_of("work_item_id", list(ids))
    sql = f"""
        UPDATE work_items SET {set_sql}
        WHERE {condition} AND {CLAIM.leaves()}
        RETURNING {", ".join(LEASE_COLUMNS)}
    """
    return sql, [*set_params, *params]


def next_opening(d: Storage) -> Statement:
    """Seconds until the first closed bucket opens again (no row: none is closed)."""
    now = d.epoch(d.now)
    sql = f"SELECT min(next_at) - {now} AS wait FROM {BUCKETS} WHERE next_at > {now}"
    return sql, []


def set_key_limits(d: Storage, limits: Sequence[tuple[str, int, float, int]]) -> Statement:
    """Give `key:` buckets the limits an enqueue set: (bucket, limit, period, burst) rows."""
    values = ", ".join(f"(%s, %s, %s, %s, 0, 0, 0, {d.now})" for _ in limits)
    params: list[Any] = [v for row in sorted(limits) for v in row]
    sql = f"""
        INSERT INTO {BUCKETS}
            (bucket, limit_count, period_seconds, burst, tat, next_at, admitted, updated_at)
        VALUES {values}
        ON CONFLICT (bucket) DO UPDATE SET limit_count = excluded.limit_count,
            period_seconds = excluded.period_seconds, burst = excluded.burst
    """
    return sql, params
