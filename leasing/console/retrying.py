"""Items failing but still retrying: pending again after failed attempts.

A failed attempt with retries left puts the item back to `pending` with
`retry_count + 1`, its error in `error_message` and its next run after a
backoff; an operator's retry of a failed item starts it again at 0. So a
pending item with `retry_count > 0` is retrying: it failed and will run again.
Its last failure is when it was handed back (`updated_at`: nothing else
writes a pending row). Interrupted attempts do not count as retries.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum

from ..models import WorkItem

# Counted exactly up to this many; past it, "more than".
RETRYING_COUNTED = 10_000


def retrying(*, using: str = "default") -> QuerySet[WorkItem]:
    """Pending items that failed at least once and wait for another attempt."""
    return WorkItem.objects.using(using).filter(retrying_condition())


def retrying_condition() -> Q:
    return Q(status="pending", retry_count__gt=0)


def retrying_count(*, using: str = "default") -> tuple[int, bool]:
    """`(count, capped)`: at most `RETRYING_COUNTED` index entries are read."""
    n = retrying(using=using).order_by().values("pk")[: RETRYING_COUNTED + 1].count()
    return min(n, RETRYING_COUNTED), n > RETRYING_COUNTED


def retrying_pairs(
    *, since: datetime, using: str = "default"
) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (queue, work type): items retrying whose last failure is since `since`,
    and their failed attempts (`retry_count` each)."""
    rows = (
        retrying(using=using)
        .filter(updated_at__gte=since)
        .order_by()
        .values("queue_name", "work_type")
        .annotate(items=Count("*"), attempts=Sum("retry_count"))
    )
    return {
        (r["queue_name"], r["work_type"]): {"items": r["items"], "attempts": r["attempts"] or 0}
        for r in rows
    }


__all__ = ["retrying", "retrying_condition", "retrying_count", "retrying_pairs"]
