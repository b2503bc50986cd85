"""The status strip above the dashboard's tiles: what needs an operator, in one line.

Every entry states a fact at its true level: the sweep's health (OK only
within 1.5 of its intervals, with a last pass free of errors and no lease
expired for more than three intervals; not running once every sweep process stopped),
leases at risk, work no live worker serves (claims),
each active pause with the items it holds, items retrying, and the replica's
lag when the console reads one. Nothing is left out because it is fine: an
entry says "OK" rather than disappear, so the strip reads the same each time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils import dateformat, timezone

from ..states import PauseKind, WorkerStatus
from .dashboard import Dashboard

# Replication lag past this many seconds is a problem (the figures are that old).
REPLICA_LAG_BAD_SECONDS = 60


@dataclass(frozen=True, slots=True)
class StripEntry:
    key: str  # stable, for tests and styles: "sweep", "at-risk", "pause-queue-billing", ...
    text: str
    level: str  # "ok", "warn" or "bad"
    url: str | None = None


def status_strip(data: Dashboard, changelist: str, pauses_url: str) -> list[StripEntry]:
    sweep = data.sweep
    sweep_text = {
        "ok": "Recovery sweep OK",
        "dead": "Recovery sweep not running",
        "late": "Recovery sweep late",
        "errors": "Recovery sweep: its last pass had errors",
        "behind": "Recovery sweep not keeping up",
    }[sweep.state]
    if sweep.ended is not None:
        # Every sweep process stopped or was lost: no pass is coming, whatever the last one.
        how = "lost" if sweep.ended.status == WorkerStatus.LOST else "stopped"
        sweep_text = f"Recovery sweep not running ({how} at {_clock(sweep.ended.ended_at)})"
    entries = [StripEntry("sweep", sweep_text, sweep.level, "#leasing-sweepers")]
    at_risk = data.lease_health.at_risk
    entries.append(
        StripEntry(
            "at-risk",
            f"{at_risk:,} lease{'s' if at_risk != 1 else ''} at risk"
            if at_risk
            else "No lease at risk",
            "bad" if at_risk else "ok",
            f"{changelist}?lease_health=at_risk",
        )
    )
    unserved = [q for q in data.queues if q.unserved]
    entries.append(
        StripEntry(
            "unserved",
            f"Unserved work: {len(unserved):,} queue and work type pair"
            f"{'s' if len(unserved) != 1 else ''}"
            if unserved
            else "Every pending work type is served",
            "bad" if unserved else "ok",
            "#leasing-queues",
        )
    )
    for kind, name in sorted(data.pauses):
        column = "queue_name" if kind == PauseKind.QUEUE else "work_type"
        held = sum(q.held_by_pause for q in data.queues if getattr(q, column) == name)
        label = "Queue" if kind == PauseKind.QUEUE else "Work type"
        entries.append(
            StripEntry(
                f"pause-{kind}-{name}",
                f"{label} {name} paused: {held:,} item{'s' if held != 1 else ''} held",
                "warn",
                pauses_url,
            )
        )
    if not data.pauses:
        entries.append(StripEntry("pauses", "Nothing paused", "ok", pauses_url))
    if data.retrying:
        more = "more than " if data.retrying_capped else ""
        entries.append(
            StripEntry(
                "retrying",
                f"{more}{data.retrying:,} retrying",
                "warn",
                f"{changelist}?retrying=yes",
            )
        )
    lag = data.replica
    if lag is not None:
        if not lag.measured or not lag.is_replica:
            text, level = lag.text[0].upper() + lag.text[1:], "ok" if lag.measured else "warn"
        else:
            bad = lag.paused or lag.seconds is None or lag.seconds > REPLICA_LAG_BAD_SECONDS
            text, level = f"Replica {lag.alias} lag {lag.text}", "bad" if bad else "ok"
        entries.append(StripEntry("replica", text, level))
    return entries


def _clock(moment: datetime) -> str:
    """`moment` in the site's time zone, as the sweepers table shows it."""
    if timezone.is_aware(moment):
        moment = timezone.localtime(moment)
    return dateformat.format(moment, "Y-m-d H:i:s")
