"""Rate limits as the console and /metrics show them: each bucket's limit, its current rate,
whether it is closed now, and the items waiting on it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..conf import get_settings
from ..models import RateBucket, WorkItem
from ..rates import KEY, QUEUE, WORK_TYPE, RateLimit, current_rate
from ..services.rate_limits import limit_of
from ..sql.runner import run_one
from ..storage import storage_for
from .backlog import PendingPair, pending_pairs
from .census import capped_counts

# The most buckets the console lists (closed ones first).
MOST = 50
# The most pending items the dashboard counts per rate key ("1,000+" past it).
WAITING_CAP = 1000


@dataclass(frozen=True, slots=True)
class RateRow:
    bucket: str
    kind: str
    name: str
    limit: RateLimit | None  # None: no limit applies any more (its setting was removed)
    per_second: float  # admissions per second over the last window
    admitted: int  # in all
    closed: bool  # admits nothing before `opens_in_seconds`
    opens_in_seconds: float
    waiting: int  # pending items of this queue, work type or rate key
    waiting_capped: bool = False  # at least `waiting`: a rate key's count stops at a cap

    @property
    def limit_per_second(self) -> float | None:
        return None if self.limit is None else self.limit.limit / self.limit.period


def _waiting(kind: str, name: str, pairs: Sequence[PendingPair]) -> int:
    """Pending items of a queue's or work type's bucket, from the per-pair counts the page
    already read (two index-only scans)."""
    if kind == QUEUE:
        return sum(p.pending for p in pairs if p.queue_name == name)
    return sum(p.pending for p in pairs if p.work_type == name)


def _keys_waiting(keys: Sequence[str], using: str, cap: int | None) -> dict[str, tuple[int, bool]]:
    """`{rate key: (pending items, whether the count stopped at cap)}`, in one statement.

    Each key's count reads `work_items_rate_key_idx`, at most `cap + 1` entries (a key may
    hold a whole import), so the panel costs the same whatever waits; one round trip for
    every key instead of one each (`census.capped_counts`).
    """
    pending = WorkItem.objects.using(using).filter(status=WorkItem.Status.PENDING).order_by()
    counted = capped_counts(
        {
            key: pending.filter(rate_key=key).values("pk")[: None if cap is None else cap + 1]
            for key in keys
        },
        using,
    )
    return {
        key: (counted[key], False) if cap is None else (min(counted[key], cap), counted[key] > cap)
        for key in keys
    }


def rate_table(
    using: str = "default",
    *,
    pending: Sequence[PendingPair] | None = None,
    waiting_cap: int | None = None,
    now: datetime | None = None,
) -> tuple[RateRow, ...]:
    """Every bucket's figures at the database clock (the closed first, at most `MOST`).

    `pending`: the per-(queue, work type) pending counts, when the caller has read them
    (`backlog.pending_pairs`); `waiting_cap`: the most items counted per rate key (the
    dashboard's `WAITING_CAP`; None, as /metrics asks: every one); `now`: the caller's
    reading of the database clock, read here unless given.
    """
    if now is None:
        d = storage_for(using)
        row: dict[str, Any] | None = run_one(using, (f"SELECT {d.epoch(d.now)} AS now", []))
        seconds = float(row["now"]) if row else 0.0
    else:
        seconds = now.timestamp()
    configured = get_settings().rate_limits
    rows = []
    buckets = list(RateBucket.objects.using(using).order_by("-next_at", "bucket")[:MOST])
    if pending is None and any(not b.bucket.startswith(f"{KEY}:") for b in buckets):
        pending = pending_pairs(using=using)
    named = [b.bucket.partition(":") for b in buckets]
    keys = _keys_waiting(
        sorted({name for kind, _, name in named if kind not in (QUEUE, WORK_TYPE)}),
        using,
        waiting_cap,
    )
    for b in buckets:
        kind, _, name = b.bucket.partition(":")
        stored = None
        if b.limit_count is not None and b.period_seconds is not None and b.burst is not None:
            stored = RateLimit(b.limit_count, b.period_seconds, b.burst)
        closed = b.next_at > seconds
        waiting, capped = (
            (_waiting(kind, name, pending or ()), False)
            if kind in (QUEUE, WORK_TYPE)
            else keys[name]
        )
        rows.append(
            RateRow(
                bucket=b.bucket,
                kind=kind,
                name=name,
                limit=limit_of(b.bucket, stored, configured),
                per_second=round(
                    current_rate(b.window_start, b.window_admitted, b.previous_admitted, seconds), 2
                ),
                admitted=b.admitted,
                closed=closed,
                opens_in_seconds=max(0.0, b.next_at - seconds) if closed else 0.0,
                waiting=waiting,
                waiting_capped=capped,
            )
        )
    return tuple(rows)
