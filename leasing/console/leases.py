"""In-progress items by the state of their lease."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count, Q
from django.db.models.functions import Now

from ..conf import get_settings
from ..models import WorkItem


@dataclass(frozen=True, slots=True)
class LeaseHealthSummary:
    """In-progress items by the state of their lease.

    `active` and `stale` are the two columns of the monitoring query: every
    `in_progress` item, and those among them whose heartbeat is older than the
    stale threshold (expired or not). `healthy`, `stale_live` and `expired`
    split `active` into the three lease-health filters of the work item list
    (`expired`: the lease ran out and the sweep has not recovered it yet);
    `no_progress` are healthy leases whose handler has not beaten for the
    threshold (a heartbeat thread keeps a stuck handler's lease alive).
    """

    active: int
    stale: int
    healthy: int
    stale_live: int
    expired: int
    no_progress: int
    stale_after_seconds: float


def lease_health(
    *, using: str = "default", stale_seconds: float | None = None
) -> LeaseHealthSummary:
    """One pass over the in-progress rows (the `in_progress` partial index)."""
    seconds = get_settings().stale_heartbeat if stale_seconds is None else stale_seconds
    cutoff = Now() - timedelta(seconds=seconds)
    live = Q(lease_expires_at__gte=Now())
    fresh = Q(heartbeat_at__gte=cutoff)
    no_progress = Q(progress_at__lt=cutoff) | Q(
        progress_at__isnull=True, lease_acquired_at__lt=cutoff
    )
    row = (
        WorkItem.objects.using(using)
        .in_progress()
        .aggregate(
            active=Count("*"),
            stale=Count("pk", filter=Q(heartbeat_at__lt=cutoff)),
            healthy=Count("pk", filter=live & fresh),
            stale_live=Count("pk", filter=live & Q(heartbeat_at__lt=cutoff)),
            expired=Count("pk", filter=Q(lease_expires_at__lt=Now())),
            no_progress=Count("pk", filter=live & fresh & no_progress),
        )
    )
    return LeaseHealthSummary(stale_after_seconds=seconds, **row)
