"""Fair queues as the console shows them: per queue of `LEASING["FAIR_QUEUES"]`, how many
fairness keys have claimable items waiting, and the keys with the most."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Min, QuerySet
from django.db.models.functions import Coalesce

from ..conf import get_settings
from ..models import WorkItem

# The most keys listed per queue (by pending count).
TOP_KEYS = 10


@dataclass(frozen=True, slots=True)
class FairKey:
    key: str
    pending: int  # claimable now: pending, due, no dependency left
    weight: int  # turns per round (`FAIRNESS_WEIGHTS`, default 1)
    oldest_pending_age_seconds: float


@dataclass(frozen=True, slots=True)
class FairQueue:
    queue_name: str
    keys: int  # fairness keys with claimable items
    top: tuple[FairKey, ...]  # at most `TOP_KEYS`, the most pending first


def claimable_by_key(
    queues: Sequence[str], *, now: datetime, using: str = "default"
) -> QuerySet[Any, Any]:
    """Per (queue, fairness key) of `queues`: its claimable items and the oldest one's due time.

    Grouped over `work_items_fair_idx` (its condition; leading columns queue, key, then
    the due time), so it reads only these queues' claimable items.
    """
    return (
        WorkItem.objects.using(using)
        .filter(
            status=WorkItem.Status.PENDING,
            dependencies_left=0,
            queue_name__in=queues,
            fairness_key__isnull=False,
        )
        .alias(available_at=Coalesce("run_after", "created_at"))
        .filter(available_at__lte=now)
        .values("queue_name", "fairness_key")
        .annotate(pending=Count("*"), oldest=Min("available_at"))
        .order_by()
    )


def fair_queue_table(*, now: datetime, using: str = "default") -> tuple[FairQueue, ...]:
    """Every fair queue's keys with claimable items, at the database clock `now`: one
    grouped read (`claimable_by_key`), none when no queue is fair."""
    settings = get_settings()
    queues = settings.fair_queues
    if not queues:
        return ()
    rows = claimable_by_key(queues, now=now, using=using)
    by_queue: dict[str, list[FairKey]] = {q: [] for q in queues}
    for row in rows:
        key = str(row["fairness_key"])  # never NULL: filtered above
        by_queue[row["queue_name"]].append(
            FairKey(
                key=key,
                pending=row["pending"],
                weight=settings.fairness_weights.get(key, 1),
                oldest_pending_age_seconds=max(0.0, (now - row["oldest"]).total_seconds()),
            )
        )
    return tuple(
        FairQueue(
            queue_name=queue,
            keys=len(keys),
            top=tuple(sorted(keys, key=lambda k: (-k.pending, k.key))[:TOP_KEYS]),
        )
        for queue, keys in by_queue.items()
    )
