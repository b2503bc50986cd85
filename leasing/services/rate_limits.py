"""Rate-limited claims: items admitted under GCRA buckets held in the database.

Used for every claim while `LEASING["RATE_LIMITS"]` is set (`LeaseManager.claim`).
The statements and why they are exact across hosts are in `leasing.sql.rates`;
the limit's arithmetic is `leasing.rates`. Here: which buckets an item falls
under, and the admission itself, in claim order: an item is admitted when
every one of its buckets conforms at the database clock (`now >= tat -
tolerance`), and each then moves on by its interval (`tat = max(tat, now) +
interval`). An item one of whose buckets does not conform is left pending,
unlocked at commit, and charged nothing; the manager records how long until
the first bucket opens, so an idle worker sleeps until then instead of
spinning (`rate_wait`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ..conf import get_settings
from ..rates import (
    ANY_KEY,
    KEY,
    QUEUE,
    WORK_TYPE,
    BucketState,
    RateLimit,
    bucket_name,
    windows_after,
)
from ..sql import rates as sql
from ..sql.fairness import Fairness, next_cursors
from ..sql.runner import run, run_one, run_rows, translate_db_errors
from ..storage import storage_for

if TYPE_CHECKING:
    from ..sql.limits import Limits
    from ..sql.terms import ClaimFilters, LeaseTerms
    from ..storage.base import Storage
    from .held import Lease
    from .leases import LeaseManager

# A candidate row: (work_item_id, queue_name, work_type, rate_key), and in a fair claim
# its fairness key and its key's place in the rotation.
Candidate = tuple[Any, ...]


def buckets_of(row: Candidate) -> list[str]:
    """The buckets an item may fall under (only those with a limit hold it back)."""
    queue_name, work_type, rate_key = row[1:4]
    names = [bucket_name(QUEUE, queue_name), bucket_name(WORK_TYPE, work_type)]
    if rate_key is not None:
        names.append(bucket_name(KEY, rate_key))
    return names


def limit_of(
    bucket: str, stored: RateLimit | None, configured: Mapping[str, RateLimit | None]
) -> RateLimit | None:
    """A bucket's limit: an enqueue's (a key's), else its setting, else `key:*` for a key."""
    if stored is not None:
        return stored
    limit = configured.get(bucket)
    if limit is None and bucket.startswith(f"{KEY}:"):
        limit = configured.get(ANY_KEY)
    return limit


def admit(
    rows: Sequence[Candidate], limits: Mapping[str, RateLimit], tats: dict[str, float], now: float
) -> tuple[list[str], dict[str, int]]:
    """The ids admitted in claim order, and how many each bucket admitted; moves `tats` on."""
    admitted: list[str] = []
    counts: dict[str, int] = {}
    for row in rows:
        limited = [b for b in buckets_of(row) if b in limits]
        if any(tats[b] - limits[b].tolerance > now for b in limited):
            continue
        for b in limited:
            tats[b] = max(tats[b], now) + limits[b].interval
            counts[b] = counts.get(b, 0) + 1
        admitted.append(row[0])
    return admitted, counts


def claim_rate_limited(
    manager: LeaseManager,
    n: int,
    terms: LeaseTerms,
    filters: ClaimFilters,
    limits: Limits,
    fairness: Fairness | None = None,
) -> list[Lease]:
    """Claim up to `n` items that every rate limit admits (see the module), in turn order
    with `fairness`."""
    using = manager.using
    d = storage_for(using)
    configured = get_settings().rate_limits
    if _settled.get(using) is not configured:
        reopen_stale_buckets(using, configured)
        _settled[using] = configured
    claimed: list[tuple[Any, ...]] = []
    with translate_db_errors(), transaction.atomic(using=using):
        d.lock_limits(limits)
        rows = run_rows(using, sql.candidates(d, filters, n, limits, fairness))
        names = sorted({b for row in rows for b in buckets_of(row)})
        if names:
            states, now = _lock(using, d, names, configured)
            bucket_limits: dict[str, RateLimit] = {}
            tats: dict[str, float] = {}
            windows = {s["bucket"]: s for s in states}
            for state in states:
                stored = None
                if state["limit_count"] is not None:
                    stored = RateLimit(
                        state["limit_count"], state["period_seconds"], state["burst"]
                    )
                limit = limit_of(state["bucket"], stored, configured)
                if limit is not None:
                    bucket_limits[state["bucket"]] = limit
                    tats[state["bucket"]] = float(state["tat"])
            admitted, counts = admit(rows, bucket_limits, tats, now)
            for bucket, count in sorted(counts.items()):
                w = windows[bucket]
                start, current, previous = windows_after(
                    w["window_start"], w["window_admitted"], w["previous_admitted"], now, count
                )
                saved = BucketState(
                    tats[bucket],
                    tats[bucket] - bucket_limits[bucket].tolerance,
                    count,
                    start,
                    current,
                    previous,
                )
                run(using, sql.save_bucket(d, bucket, saved))
            if admitted:
                claimed = run_rows(using, sql.claim_ids(d, manager.worker_id, admitted, terms, now))
    leases = manager.leases_from_rows(claimed)
    if fairness is not None and leases:
        taken = {lease.work_item_id for lease in leases}
        turns = [(row[1], row[4], row[5]) for row in rows if row[0] in taken]
        manager.fair_cursors.update(next_cursors(fairness, turns))
    manager.rate_wait = None
    if len(leases) < n:
        row = run_one(using, sql.next_opening(d))
        if row is not None and row["wait"] is not None:
            # Waiting workers wake spread over half the bucket's slack, not all at once
            # at its opening: one of them claims what opened, and no turn is lost.
            slack = max(0.0, float(row["slack"]))
            manager.rate_wait = max(0.0, float(row["wait"])) + random.uniform(0.0, slack / 2)
    return leases


# Per database alias, the `RATE_LIMITS` (the settings' own object) whose limits this
# process has settled the closed buckets against (`reopen_stale_buckets`).
_settled: dict[str, Mapping[str, RateLimit | None]] = {}


def reopen_stale_buckets(using: str, configured: Mapping[str, RateLimit | None]) -> int:
    """Open what an earlier limit closed beyond what the current one allows; how many.

    The claim's gate reads each bucket's `next_at`, written under the limit of the
    claim that last admitted through it. A limit raised or dropped from the setting
    would leave its bucket closed for up to one period of the old limit (a day for
    "1/d"). Run once per process and setting (at its first rate-limited claim): a
    closed bucket's tat is capped at `now + tolerance + interval` of its current limit,
    the most an admission under that limit leaves (a bucket that just admitted its
    whole burst), so a bucket its current limit closed is left as it is, and one closed
    further opens one interval from now, then follows the new rate; its `next_at` is
    brought forward to match, and one without a limit any more is opened. A
    bucket's `next_at` only ever moves earlier here: a lowered limit is held by the
    admission under the bucket's lock, as always.
    """
    d = storage_for(using)
    reopened = 0
    with translate_db_errors():
        for row in run(using, sql.closed_buckets(d)):
            stored = None
            if row["limit_count"] is not None:
                stored = RateLimit(row["limit_count"], row["period_seconds"], row["burst"])
            limit = limit_of(row["bucket"], stored, configured)
            tat, next_at, now = float(row["tat"]), float(row["next_at"]), float(row["now"])
            try:
                if limit is None:
                    new_tat, new_next = min(tat, now), now
                else:
                    new_tat = min(tat, now + limit.tolerance + limit.interval)
                    new_next = min(next_at, new_tat - limit.tolerance)
            except (ArithmeticError, TypeError):  # a row not written by Leasing: left alone
                continue
            if new_next < next_at:
                seen = (row["tat"], row["next_at"])
                statement = sql.reopen_bucket(row["bucket"], seen, new_tat, new_next)
                reopened += len(run(using, statement))
    return reopened


def _lock(
    using: str, d: Storage, names: list[str], configured: Mapping[str, RateLimit | None]
) -> tuple[list[dict[str, Any]], float]:
    """Lock the buckets (a bucket with a setting gets its row now; a key's own limit came
    with its row) and read the clock after the locks are held."""
    with_setting = [b for b in names if limit_of(b, None, configured) is not None]
    others = [b for b in names if b not in with_setting]
    states = run(using, sql.lock_new_buckets(d, with_setting)) if with_setting else []
    clocks = [float(state["now"]) for state in states]
    if others:
        states += run(using, sql.lock_buckets(d, others))
        clocks.append(float(run(using, sql.clock(d))[0]["now"]))
    return states, max(clocks)


def set_key_limits(using: str, limits: Mapping[str, RateLimit]) -> None:
    """Store the limits an enqueue gave its rate keys (the last one given wins)."""
    rows = [
        (bucket_name(KEY, key), limit.limit, limit.period, limit.burst)
        for key, limit in limits.items()
    ]
    with translate_db_errors():
        run(using, sql.set_key_limits(storage_for(using), rows))
