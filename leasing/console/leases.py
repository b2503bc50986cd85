"""In-progress items by the state of their lease, judged by each type's own heartbeat.

A lease is renewed every heartbeat period of its work type (its handler's
`heartbeat_interval`, at most a quarter of its lease, as the worker's renewer
does), so a heartbeat older than `STALE_INTERVALS` of those periods is stale,
never later than `LEASING["STALE_HEARTBEAT"]`. A type beating every 5 s shows
stale after 15 s, well before its 45 s lease runs out.

A lease is only as healthy as the process holding it: a live lease whose
holder is not a live worker (its row silent, lost, stopped or missing) is
*at risk*. Its heartbeat may still look fresh, yet nothing will renew it: it
expires, then the sweep re-queues it (or fails it). At-risk leases are never
counted healthy or stale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db.models import Case, Count, DurationField, Q, Value, When
from django.db.models.functions import Now

from ..conf import get_settings
from ..handlers import registry
from ..models import Worker, WorkItem
from ..sql.runner import database_now
from .durations import age
from .liveness import liveness

STALE_INTERVALS = 3
# The live workers read to judge holders: more than any deployment registers.
HOLDERS_READ = 2000


def heartbeat_period(work_type: str | None = None) -> float:
    """Seconds between two renewals of a lease of `work_type` (the renewer's period)."""
    conf = get_settings()
    spec = registry.get(work_type) if work_type is not None and work_type in registry else None
    interval = (spec.heartbeat_interval if spec else None) or conf.heartbeat_interval
    lease = (spec.lease_duration if spec else None) or conf.lease_duration
    return min(interval, lease / 4)


def stale_after(work_type: str | None = None) -> float:
    """Seconds without a heartbeat after which a lease of `work_type` is stale."""
    return min(get_settings().stale_heartbeat, STALE_INTERVALS * heartbeat_period(work_type))


def stale_thresholds() -> dict[str, float]:
    """The registered work types whose threshold differs from the default's."""
    default = stale_after()
    return {t: s for t in registry.work_types() if (s := stale_after(t)) != default}


def beat_older_than_threshold(
    column: str = "heartbeat_at", thresholds: Mapping[str, float] | None = None
) -> Q:
    """`column` older than the row's work type's stale threshold (one SQL condition).

    The threshold is one CASE on the work type: a page's conditions repeat
    this one several times, and a branch per work type cost more to build
    than the read to run.
    """
    thresholds = stale_thresholds() if thresholds is None else thresholds
    threshold: Any = Value(timedelta(seconds=stale_after()), output_field=DurationField())
    if thresholds:
        threshold = Case(
            *(
                When(work_type=work_type, then=Value(timedelta(seconds=seconds)))
                for work_type, seconds in thresholds.items()
            ),
            default=threshold,
            output_field=DurationField(),
        )
    return Q(**{f"{column}__lt": Now() - threshold})


def live_holders(*, using: str = "default") -> list[str]:
    """Ids of the workers alive now: running or stopping, and not silent."""
    now = database_now(using)
    rows = Worker.objects.using(using).workers().alive().order_by()[:HOLDERS_READ]
    return [w.worker_id for w in rows if liveness(w, age(now, w.last_seen_at) or 0.0).alive]


@dataclass(frozen=True, slots=True)
class LeaseConditions:
    """The SQL conditions of each lease health, against one reading of the live holders."""

    holders: tuple[str, ...]
    thresholds: Mapping[str, float] = field(default_factory=dict)

    @property
    def live(self) -> Q:
        return Q(lease_expires_at__gte=Now())

    @property
    def held_by_live_worker(self) -> Q:
        return Q(lease_holder__in=list(self.holders))

    @property
    def stale_beat(self) -> Q:
        return beat_older_than_threshold("heartbeat_at", self.thresholds)

    @property
    def healthy(self) -> Q:
        return self.live & self.held_by_live_worker & ~self.stale_beat

    @property
    def stale_live(self) -> Q:
        return self.live & self.held_by_live_worker & self.stale_beat

    @property
    def at_risk(self) -> Q:
        return self.live & ~self.held_by_live_worker

    @property
    def expired(self) -> Q:
        return Q(lease_expires_at__lt=Now())

    @property
    def progress_old(self) -> Q:
        """The handler has not beaten for the threshold (never: counted from the claim)."""
        return beat_older_than_threshold("progress_at", self.thresholds) | (
            Q(progress_at__isnull=True)
            & beat_older_than_threshold("lease_acquired_at", self.thresholds)
        )

    @property
    def no_progress(self) -> Q:
        return self.healthy & self.progress_old


def lease_conditions(
    *, using: str = "default", holders: Iterable[str] | None = None
) -> LeaseConditions:
    return LeaseConditions(
        holders=tuple(live_holders(using=using) if holders is None else holders),
        thresholds=stale_thresholds(),
    )


# The lease-health values of the work item list's filter.
LEASE_HEALTH_CHOICES = (
    ("healthy", "Healthy"),
    ("stale", "Stale heartbeat"),
    ("at_risk", "At risk: holder silent or lost"),
    ("expired", "Expired, awaiting sweep"),
    ("no_progress", "Alive, no progress"),
)


def lease_health_condition(value: str, *, using: str = "default") -> Q:
    """The condition of the list filter's `value` (a key of `LEASE_HEALTH_CHOICES`)."""
    conditions = lease_conditions(using=using)
    return {
        "healthy": conditions.healthy,
        "stale": conditions.stale_live,
        "at_risk": conditions.at_risk,
        "expired": conditions.expired,
        "no_progress": conditions.no_progress,
    }[value]


@dataclass(frozen=True, slots=True)
class LeaseHealthSummary:
    """In-progress items by the state of their lease.

    `active` and `stale` are the two columns of the monitoring query: every
    `in_progress` item, and those among them whose heartbeat is older than
    their type's stale threshold (expired or not). `healthy`, `stale_live`,
    `at_risk` and `expired` split `active` (their sum): healthy and stale
    leases are held by a live worker, at-risk ones by a silent, lost or
    unknown holder, expired ones ran out and the sweep has not recovered them
    yet. `no_progress` are healthy leases whose handler has not beaten for the
    threshold (a heartbeat thread keeps a stuck handler's lease alive).
    `stale_after_seconds` is the default threshold; `thresholds` the work
    types whose own heartbeat gives them another.
    """

    active: int
    stale: int
    healthy: int
    stale_live: int
    expired: int
    no_progress: int
    stale_after_seconds: float
    at_risk: int = 0
    thresholds: Mapping[str, float] = field(default_factory=dict)


def lease_health(
    *, using: str = "default", holders: Iterable[str] | None = None
) -> LeaseHealthSummary:
    """One pass over the in-progress rows (the `in_progress` partial index).

    `holders`: the ids of the live workers when the caller has read them.
    Grouped per holder, whose liveness is then looked up here: the conditions
    stay free of the list of live holders, which made building the query cost
    more than running it.
    """
    c = lease_conditions(using=using, holders=holders)
    live = set(c.holders)
    fresh = c.live & ~c.stale_beat
    rows = (
        WorkItem.objects.using(using)
        .in_progress()
        .order_by()
        .values("lease_holder")
        .annotate(
            active=Count("*"),
            stale=Count("pk", filter=c.stale_beat),
            fresh=Count("pk", filter=fresh),
            stale_live=Count("pk", filter=c.live & c.stale_beat),
            expired=Count("pk", filter=c.expired),
            no_progress=Count("pk", filter=fresh & c.progress_old),
        )
    )
    totals = dict.fromkeys(("active", "stale", "healthy", "stale_live", "expired"), 0)
    totals |= {"no_progress": 0, "at_risk": 0}
    for row in rows:
        totals["active"] += row["active"]
        totals["stale"] += row["stale"]
        totals["expired"] += row["expired"]
        if row["lease_holder"] in live:
            totals["healthy"] += row["fresh"]
            totals["stale_live"] += row["stale_live"]
            totals["no_progress"] += row["no_progress"]
        else:  # nothing renews them, whatever their heartbeat says
            totals["at_risk"] += row["fresh"] + row["stale_live"]
    return LeaseHealthSummary(stale_after_seconds=stale_after(), thresholds=c.thresholds, **totals)
