"""The tiles at the top of the dashboard: one figure each, linked to the filtered list."""

from __future__ import annotations

from dataclasses import dataclass

from .dashboard import Dashboard
from .durations import humanize_seconds
from .leases import STALE_INTERVALS

# An item claimable for longer than this is a backlog worth a warning.
OLDEST_PENDING_WARNING_SECONDS = 3600


@dataclass(frozen=True, slots=True)
class Tile:
    label: str
    value: str
    hint: str
    level: str  # "ok", "warn", "bad" or "info"
    url: str | None = None


def _fate(data: Dashboard) -> str:
    """What follows an at-risk lease's expiry, never more hopeful than the sweep's health."""
    return f", {data.sweep.lease_fate}" if data.sweep.ok else f"; {data.sweep.lease_fate}"


def tiles(data: Dashboard, changelist: str) -> list[Tile]:
    health, backlog = data.lease_health, data.backlog
    stale_after = humanize_seconds(health.stale_after_seconds)
    oldest = backlog.oldest_age_seconds
    expired_level = "ok"
    if health.expired:
        expired_level = "warn" if data.sweep.ok else "bad"
    unserved = [r for r in data.queues if r.unserved]
    return [
        Tile(
            "Unserved work",
            f"{len(unserved):,}",
            "queue and work type pairs with pending items and no live worker claiming them"
            if unserved
            else "every pending work type has a live worker claiming it",
            "bad" if unserved else "ok",
            "#leasing-queues",
        ),
        Tile(
            "Active leases",
            f"{health.active:,}",
            f"{health.healthy:,} healthy · {health.stale_live:,} stale · "
            f"{health.at_risk:,} at risk · {health.expired:,} expired",
            "bad" if health.at_risk else "warn" if health.healthy < health.active else "info",
            f"{changelist}?status__exact=in_progress",
        ),
        Tile(
            "At-risk leases",
            f"{health.at_risk:,}",
            f"holder silent, lost or unknown: each expires{_fate(data)}"
            if health.at_risk
            else "every live lease is held by a live worker",
            "bad" if health.at_risk else "ok",
            f"{changelist}?lease_health=at_risk",
        ),
        Tile(
            "Stale heartbeats",
            f"{health.stale:,}",
            f"no heartbeat for {STALE_INTERVALS} of their type's periods (at most "
            f"{stale_after}); {health.stale_live:,} of them live",
            "warn" if health.stale else "ok",
            f"{changelist}?lease_health=stale",
        ),
        Tile(
            "Expired, awaiting sweep",
            f"{health.expired:,}",
            "lease ran out; the recovery sweep re-queues or fails them",
            expired_level,
            f"{changelist}?lease_health=expired",
        ),
        Tile(
            "Pending backlog",
            f"{backlog.pending:,}",
            f"{backlog.claimable:,} claimable · {backlog.deferred:,} waiting for run_after"
            + (f" · {backlog.paused:,} held by a pause" if backlog.paused else "")
            + (f" · {backlog.blocked:,} waiting for dependencies" if backlog.blocked else ""),
            "info",
            f"{changelist}?status__exact=pending",
        ),
        Tile(
            "Oldest pending",
            humanize_seconds(oldest),
            "age of the oldest claimable item since it was enqueued (paused ones excluded)"
            if oldest is not None
            else "nothing is waiting",
            "warn" if oldest is not None and oldest > OLDEST_PENDING_WARNING_SECONDS else "ok",
            f"{changelist}?status__exact=pending",
        ),
        Tile(
            "Retrying",
            f"{'more than ' if data.retrying_capped else ''}{data.retrying:,}",
            "failed and waiting for another attempt (their errors are in Top errors)"
            if data.retrying
            else "no item is failing and waiting for a retry",
            "warn" if data.retrying else "ok",
            f"{changelist}?retrying=yes",
        ),
        Tile(
            "Alive, no progress",
            f"{health.no_progress:,}",
            "heartbeat fresh but no handler beat for the stale threshold: possibly stuck",
            "warn" if health.no_progress else "ok",
            f"{changelist}?lease_health=no_progress",
        ),
    ]
