"""Statements of rate limits: the claim's gate, the buckets' rows and the admitted items' claim.

A rate-limited claim (`leasing.services.rate_limits`) runs in one transaction:

1. `candidates`: up to `n` claimable items in claim order (locked with SKIP
   LOCKED on PostgreSQL, so concurrent claimers never pick the same row),
   past the gate: an item none of whose buckets (`queue:`, `work_type:`,
   `key:`) is closed (`next_at` after the database clock) is a candidate.
   The gate is an uncorrelated probe of the buckets' primary key per row: a
   waiting item is neither locked nor claimed, so it stays pending, costs no
   attempt and is never retried.
2. `lock_new_buckets` / `lock_buckets`: the candidates' buckets, created if
   missing and row-locked in code-point order (two claimers never wait for
   each other in a cycle); the database clock read after the locks are held
   is the time the admission is decided at.
3. `save_bucket` and `claim_ids`: the buckets' new state and the claim of the
   admitted items, by id, re-checking that they are still pending, stamped
   with the clock reading the admission was decided at.

Serializing on the bucket rows (not on a snapshot's count) keeps the limit
exact across every worker and host: a claimer that waited for a bucket's
lock reads the state its previous holder committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ..transitions import CLAIM
from .candidates import where
from .fairness import Fairness, fair_candidates
from .limits import CLAIM_ORDER, Limits, limited_candidates
from .runner import Statement

if TYPE_CHECKING:
    from ..rates import BucketState
from .terms import ClaimFilters, LeaseTerms
from .work_items import LEASE_COLUMNS, claim_set

if TYPE_CHECKING:
    from ..storage.base import Storage

BUCKETS = "leasing_rate_buckets"
# A candidate's buckets, as the claim reads them (`rate_key` NULL: no key bucket).
CANDIDATE_COLUMNS = "work_item_id, queue_name, work_type, rate_key"
# A bucket's state as the admission reads it.
STATE = (
    "bucket, tat, limit_count, period_seconds, burst, window_start, window_admitted, "
    "previous_admitted"
)


def gate(d: Storage) -> str:
    """The claim's condition: none of the row's buckets is closed at the database clock."""
    return f"""NOT EXISTS (
        SELECT 1 FROM {BUCKETS} AS rb
        WHERE rb.bucket IN ('queue:' || work_items.queue_name,
                            'work_type:' || work_items.work_type,
                            'key:' || work_items.rate_key)
          AND rb.next_at > {d.epoch(d.now)})"""


def candidates(
    d: Storage, filters: ClaimFilters, n: int, limits: Limits, fairness: Fairness | None = None
) -> Statement:
    """Up to `n` claimable items past the gate, in claim order (in turn order, with their
    fairness key and its place in the rotation, for a fair claim), with their buckets' names."""
    condition, params = where(d, filters)
    condition = f"{condition} AND {gate(d)}"
    if fairness is not None:
        ctes, cte_params = fair_candidates(d, condition, params, n, fairness, limits)
        sql = f"""
            WITH {ctes}
            SELECT {", ".join(f"w.{c}" for c in CANDIDATE_COLUMNS.split(", "))},
                   c.fairness_key, c.pos
            FROM candidate AS c JOIN work_items AS w ON w.work_item_id = c.work_item_id
            ORDER BY c.turn, c.pos, w.priority DESC, COALESCE(w.run_after, w.created_at),
                     w.created_at, w.work_item_id
        """
        return d.in_claim_order(sql), cte_params
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


def lock_new_buckets(d: Storage, buckets: Sequence[str]) -> Statement:
    """Create these buckets' rows if missing and lock them, in code-point order (an upsert
    that updates locks the row, waiting for its holder); each row comes back with the
    clock read after its lock was granted."""
    values = ", ".join(f"(%s, 0, 0, 0, {d.now})" for _ in buckets)
    sql = f"""
        INSERT INTO {BUCKETS} (bucket, tat, next_at, admitted, updated_at) VALUES {values}
        ON CONFLICT (bucket) DO UPDATE SET bucket = excluded.bucket
        RETURNING {STATE}, {d.epoch(d.wall_clock())} AS now
    """
    return sql, sorted(buckets)


def lock_buckets(d: Storage, buckets: Sequence[str]) -> Statement:
    """The existing rows of these buckets, locked in code-point order."""
    condition, params = d.one_of("bucket", list(buckets))
    sql = f"""
        SELECT {STATE} FROM {BUCKETS}
        WHERE {condition} ORDER BY bucket {d.collate_c()} {d.row_lock("UPDATE")}
    """
    return sql, params


def clock(d: Storage) -> Statement:
    """The database clock, read when the statement runs, in seconds since the epoch."""
    return f"SELECT {d.epoch(d.wall_clock())} AS now", []


def save_bucket(d: Storage, bucket: str, state: BucketState) -> Statement:
    sql = f"""
        UPDATE {BUCKETS} SET tat = %s, next_at = %s, admitted = admitted + %s,
            window_start = %s, window_admitted = %s, previous_admitted = %s,
            updated_at = {d.now}
        WHERE bucket = %s
    """
    return sql, [
        state.tat,
        state.next_at,
        state.admitted,
        state.window_start,
        state.window_admitted,
        state.previous_admitted,
        bucket,
    ]


class AtInstant:
    """A storage's fragments with the clock fixed at the instant the admission was decided,
    so an item's claim time is the time its buckets admitted it."""

    def __init__(self, d: Storage, epoch: float) -> None:
        self._d = d
        self._epoch = epoch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._d, name)

    @property
    def now(self) -> str:
        return self._d.instant(self._epoch)

    def clock(self) -> str:
        return self._d.instant(self._epoch, with_offset=True)


def claim_ids(
    d: Storage, holder: str, ids: Sequence[str], terms: LeaseTerms, at: float
) -> Statement:
    """Claim these (locked, admitted) items at `at` (the admission's clock reading)."""
    set_sql, set_params = claim_set(cast("Storage", AtInstant(d, at)), holder, terms)
    condition, params = d.one_of("work_item_id", list(ids))
    sql = f"""
        UPDATE work_items SET {set_sql}
        WHERE {condition} AND {CLAIM.leaves()}
        RETURNING {", ".join(LEASE_COLUMNS)}
    """
    return sql, [*set_params, *params]


def next_opening(d: Storage) -> Statement:
    """The first closed bucket: seconds until it opens, and its slack (how late a claim may
    come without losing a turn: its tolerance). No row: no bucket is closed."""
    now = d.epoch(d.now)
    sql = f"""
        SELECT next_at - {now} AS wait, tat - next_at AS slack FROM {BUCKETS}
        WHERE next_at > {now} ORDER BY next_at LIMIT 1
    """
    return sql, []


def set_key_limits(d: Storage, limits: Sequence[tuple[str, int, float, int]]) -> Statement:
    """Give `key:` buckets the limits an enqueue set: (bucket, limit, period, burst) rows."""
    values = ", ".join(f"(%s, %s, %s, %s, 0, 0, 0, {d.now})" for _ in limits)
    params: list[Any] = [v for row in sorted(limits) for v in row]
    # A bucket closed under its earlier limit owes at most what the new one can leave
    # (a bucket that just admitted its whole burst): its tat at most `now + tolerance +
    # interval`, so it opens no later than one new interval from now. A lowered limit
    # is held by the claim's admission, under the bucket's lock.
    now = d.epoch(d.now)
    interval = "(excluded.period_seconds / excluded.limit_count)"
    tolerance = f"((excluded.burst - excluded.limit_count) * {interval})"
    cap = f"({now} + {tolerance} + {interval})"
    tat = f"(CASE WHEN {BUCKETS}.tat > {cap} THEN {cap} ELSE {BUCKETS}.tat END)"
    sql = f"""
        INSERT INTO {BUCKETS}
            (bucket, limit_count, period_seconds, burst, tat, next_at, admitted, updated_at)
        VALUES {values}
        ON CONFLICT (bucket) DO UPDATE SET limit_count = excluded.limit_count,
            period_seconds = excluded.period_seconds, burst = excluded.burst,
            tat = {tat},
            next_at = CASE WHEN {BUCKETS}.next_at > {tat} - {tolerance}
                           THEN {tat} - {tolerance} ELSE {BUCKETS}.next_at END
    """
    return sql, params


def closed_buckets(d: Storage) -> Statement:
    """Every bucket closed at the database clock (the index on `next_at`), with its state,
    its stored limit and the clock."""
    now = d.epoch(d.now)
    sql = f"""
        SELECT bucket, tat, next_at, limit_count, period_seconds, burst, {now} AS now
        FROM {BUCKETS} WHERE next_at > {now}
    """
    return sql, []


def reopen_bucket(bucket: str, seen: tuple[float, float], tat: float, next_at: float) -> Statement:
    """Move a closed bucket's state to (tat, next_at) if it is still the state `seen`
    ((tat, next_at) as read): a claim that moved it since decided under its lock."""
    sql = f"""
        UPDATE {BUCKETS} SET tat = %s, next_at = %s
        WHERE bucket = %s AND tat = %s AND next_at = %s
        RETURNING bucket
    """
    return sql, [tat, next_at, bucket, *seen]
