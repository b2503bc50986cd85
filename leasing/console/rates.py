"""Rate limits as the console and /metrics show them: each bucket's limit, its current rate,
whether it is closed now, and the items waiting on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..conf import get_settings
from ..models import RateBucket, WorkItem
from ..rates import KEY, QUEUE, WORK_TYPE, RateLimit, current_rate
from ..services.rate_limits import limit_of
from ..sql.runner import run_one
from ..storage import storage_for

# The most buckets the console lists (closed ones first).
MOST = 50


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

    @property
    def limit_per_second(self) -> float | None:
        return None if self.limit is None else self.limit.limit / self.limit.period


def _waiting(kind: str, name: str, using: str) -> int:
    pending = WorkItem.objects.using(using).filter(status=WorkItem.Status.PENDING)
    field = {QUEUE: "queue_name", WORK_TYPE: "work_type", KEY: "rate_key"}[kind]
    return pending.filter(**{field: name}).count()


def rate_table(using: str = "default") -> tuple[RateRow, ...]:
    """Every bucket's figures at the database clock (the closed first, at most `MOST`)."""
    d = storage_for(using)
    row: dict[str, Any] | None = run_one(using, (f"SELECT {d.epoch(d.now)} AS now", []))
    now = float(row["now"]) if row else 0.0
    configured = get_settings().rate_limits
    rows = []
    buckets = RateBucket.objects.using(using).order_by("-next_at", "bucket")[:MOST]
    for b in buckets:
        kind, _, name = b.bucket.partition(":")
        stored = None
        if b.limit_count is not None and b.period_seconds is not None and b.burst is not None:
            stored = RateLimit(b.limit_count, b.period_seconds, b.burst)
        closed = b.next_at > now
        rows.append(
            RateRow(
                bucket=b.bucket,
                kind=kind,
                name=name,
                limit=limit_of(b.bucket, stored, configured),
                per_second=round(
                    current_rate(b.window_start, b.window_admitted, b.previous_admitted, now), 2
                ),
                admitted=b.admitted,
                closed=closed,
                opens_in_seconds=max(0.0, b.next_at - now) if closed else 0.0,
                waiting=_waiting(kind, name, using),
            )
        )
    return tuple(rows)
