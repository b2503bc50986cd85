"""Workers and sweepers: who is alive, what they hold, whether the watchdog runs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Case, Count, F, Min, Q, Sum, When, Window
from django.db.models.functions import Now, RowNumber

from ..conf import get_settings
from ..models import Worker, WorkerRole, WorkerStatus, WorkItem
from ..sql.runner import database_now
from ..states import WorkerRequest
from ..sweep.schedule import SCHEDULED_SWEEPER_ID
from ..sweep.sweep import ONE_OFF
from .durations import age, duration
from .liveness import ALIVE_STATUSES, SILENT_AFTER, Liveness, liveness


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One row of the `workers` table, with the leases a worker holds."""

    worker_id: str
    role: str
    status: str
    hostname: str
    pid: int
    started_at: datetime
    last_seen_at: datetime
    seconds_since_seen: float
    concurrency: int
    work_types: tuple[str, ...]
    queues: tuple[str, ...]  # empty: every queue
    liveness: Liveness
    items_completed: int
    items_failed: int
    scans: int
    items_recovered: int
    last_scan_at: datetime | None
    seconds_since_scan: float | None
    last_scan_stats: dict[str, Any] | None
    # Workers, as of their last beat (leasing.worker.runtime).
    runs_busy: int = 0
    runs_abandoned: int = 0
    quiet_since: datetime | None = None
    requested_action: str | None = None  # WorkerRequest
    requested_by: str | None = None
    request_reason: str | None = None
    lease_count: int = 0
    expired_lease_count: int = 0
    lease_ids: tuple[str, ...] = ()
    # Seconds until each shown lease expires (negative: expired), as `lease_ids`.
    lease_expires_in: tuple[float, ...] = ()
    stopped_at: datetime | None = None

    @property
    def not_claiming(self) -> str | None:
        """Why this worker claims nothing now, as its row says; None while it claims.

        Stopping, asked to stop or to be quiet (an operator's request is never
        taken back, so it counts from the moment it is made, not a beat later),
        or `quiet_since` set by its own beat: quiet, or past
        `LEASING["MAX_ABANDONED_RUNS"]` abandoned runs (`runs_abandoned` says which).
        """
        if self.status == WorkerStatus.STOPPING:
            return "stopping"
        if self.requested_action == WorkerRequest.STOP:
            return "stop requested"
        if self.requested_action == WorkerRequest.QUIET:
            return "quiet"
        if self.quiet_since is None:
            return None
        # Quiet of its own accord: past its abandoned-run bound (its beat records both).
        if self.runs_abandoned > get_settings().max_abandoned_runs:
            return f"{self.runs_abandoned} abandoned runs, over MAX_ABANDONED_RUNS"
        return "quiet"

    @property
    def ended_at(self) -> datetime:
        """When a stopped process stopped (a lost one: when it was last seen)."""
        return self.stopped_at or self.last_seen_at

    @property
    def leases_at_risk(self) -> bool:
        """Holds leases nothing renews: the process is silent, lost or stopped."""
        return self.lease_count > 0 and not self.liveness.alive

    @property
    def problem(self) -> bool:
        return (
            self.leases_at_risk
            or self.liveness.silent
            or self.expired_lease_count > 0
            or self.runs_abandoned > 0
        )

    @property
    def leases(self) -> tuple[tuple[str, float], ...]:
        return tuple(zip(self.lease_ids, self.lease_expires_in, strict=False))

    @property
    def runs_idle(self) -> int:
        """Handler threads free for work as of the last beat (a quiet worker takes none)."""
        return max(self.concurrency - self.runs_busy, 0)


def _strings(listed: Any) -> tuple[str, ...]:
    return tuple(v for v in (listed or ()) if isinstance(v, str))


def _process(row: Worker, now: datetime, **extra: Any) -> ProcessInfo:
    seen = age(now, row.last_seen_at) or 0.0
    return ProcessInfo(
        worker_id=row.worker_id,
        role=row.role,
        status=row.status,
        hostname=row.hostname,
        pid=row.pid,
        started_at=row.started_at,
        last_seen_at=row.last_seen_at,
        seconds_since_seen=seen,
        concurrency=row.concurrency,
        work_types=_strings(row.work_types),
        queues=_strings(row.queues),
        liveness=liveness(row, seen),
        items_completed=row.items_completed,
        items_failed=row.items_failed,
        scans=row.scans,
        items_recovered=row.items_recovered,
        last_scan_at=row.last_scan_at,
        seconds_since_scan=age(now, row.last_scan_at),
        last_scan_stats=row.last_scan_stats if isinstance(row.last_scan_stats, dict) else None,
        runs_busy=row.runs_busy,
        runs_abandoned=row.runs_abandoned,
        quiet_since=row.quiet_since,
        requested_action=row.requested_action,
        requested_by=row.requested_by,
        request_reason=row.request_reason,
        stopped_at=row.stopped_at,
        **extra,
    )


# --- the recovery sweep ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SweepHealth:
    """When the recovery sweep last ran, and whether that is too long ago.

    `ok` only while the newest scan is within `OK_INTERVALS` of the interval
    of the sweeper that made it (its own interval, not the configured one):
    a pass that is late shows "late" at once. Past `SILENT_AFTER` intervals
    the watchdog is dead (`dead`), as the sweeper rows say (a running
    sweeper not seen for that long is silent); never having scanned is dead too.
    A pass on time is OK only if it worked: not when it recorded errors (a
    step failed: "errors"), nor while a lease has waited more than
    `KEEP_UP_INTERVALS` of its intervals since it expired ("behind": passes
    ran and missed it).

    Only running sweeps and the rows of one-off passes (`records_passes`) are
    judged by their last pass: a sweep process that stopped or was lost is not
    running, however recent its last pass. When nothing else is left, the sweep
    is dead at once and `ended` is the process that stopped (or was lost) last.
    """

    sweepers: tuple[ProcessInfo, ...]
    last_scan_at: datetime | None  # of any sweeper, stopped ones included
    seconds_since_last_scan: float | None
    interval_seconds: float
    threshold_seconds: float  # dead past this
    ok: bool  # the last pass is within `OK_INTERVALS` of its interval
    message: str
    # Expired leases the newest pass could not recover (each failed on its own).
    unrecovered: tuple[str, ...] = ()
    dead: bool = False
    ended: ProcessInfo | None = None  # set when every sweep process stopped or was lost
    # Errors the judged sweeper's last pass recorded (a step failed: recovering, marking lost).
    last_pass_errors: int = 0
    # How long the oldest expired lease has waited for the sweep (None: no lease expired).
    oldest_expired_seconds: float | None = None
    # ok, dead, late, errors (its last pass had some) or behind (on time, yet a lease has
    # waited past `KEEP_UP_INTERVALS` of its intervals).
    state: str = "ok"

    @property
    def level(self) -> str:
        return "ok" if self.ok else "bad" if self.dead else "warn"

    @property
    def lease_fate(self) -> str:
        """What becomes of a lease nothing renews once it expires, as this health says:
        the words of an at-risk lease's row."""
        return LEASE_FATES[self.state]


# By `SweepHealth.state`: never more hopeful than the state.
LEASE_FATES = {
    "ok": "then the sweep re-queues it",
    "late": "the sweep is late; it may not re-queue it in time",
    "errors": "the sweep's last pass failed; it may not re-queue it in time",
    "behind": "the sweep is not keeping up; it may not re-queue it in time",
    "dead": "no recovery sweep is running to re-queue it",
}


# "Recovery sweep OK" while its last pass is within this many of its intervals.
OK_INTERVALS = 1.5
# A lease that expired just after a pass is recovered by the next, one interval later:
# one expired for more of its intervals than a dead sweep is allowed was missed by passes
# that ran, so the sweep is not keeping up.
KEEP_UP_INTERVALS = SILENT_AFTER
# The id the `recoverysweep --once` passes of a host share ends so
# (`leasing.management.commands.recoverysweep.once_worker_id`).
ONCE_SUFFIX = ":once"


def records_passes(sweeper: ProcessInfo) -> bool:
    """Whether the row records one-off passes rather than a sweep process.

    One-off passes (`scan_and_recover()` without `start()`: the `--once`
    passes of a host, django-q2's scheduled passes, your own scheduler's)
    leave their row `stopped` between passes by design: its status says
    nothing of whether the next pass will come, only the time since the last
    one does. Each pass says so in its stats; the ids cover rows of passes
    recorded before it did.
    """
    if (sweeper.last_scan_stats or {}).get(ONE_OFF):
        return True
    return sweeper.worker_id.endswith(ONCE_SUFFIX) or sweeper.worker_id == SCHEDULED_SWEEPER_ID


# `sweep_health` reads every running or stopping sweeper (up to `SWEEPERS_ALIVE`, the
# most recently seen first: more means crashed ones that no sweep marked lost), the
# `SWEEPERS_ENDED` stopped or lost ones with the newest passes, and the newest row of
# one-off passes: stopped rows of history must never hide a sweep that still runs.
SWEEPERS_ALIVE = 200
SWEEPERS_ENDED = 20
_ENDED_STATUSES = [s for s in WorkerStatus.values if s not in ALIVE_STATUSES]


def _sweeper_rows(using: str) -> list[Worker]:
    """The sweepers `sweep_health` judges by, newest pass first, in one statement.

    Each subquery is a range of `workers_role_status_idx` (role, status); the
    stopped rows are sorted in memory, as few as the sweep processes ever started.
    """
    newest_first = (F("last_scan_at").desc(nulls_last=True), F("last_seen_at").desc())
    sweepers = Worker.objects.using(using).sweepers()
    alive = sweepers.filter(status__in=ALIVE_STATUSES).order_by("-last_seen_at")
    ended = sweepers.filter(status__in=_ENDED_STATUSES).order_by(*newest_first)
    # As `records_passes`: a stopped row of one-off passes is judged by its last pass.
    one_off = ended.filter(
        Q(**{f"last_scan_stats__{ONE_OFF}": True})
        | Q(worker_id__endswith=ONCE_SUFFIX)
        | Q(worker_id=SCHEDULED_SWEEPER_ID)
    )
    return list(
        sweepers.filter(
            Q(pk__in=alive.values("pk")[:SWEEPERS_ALIVE])
            | Q(pk__in=ended.values("pk")[:SWEEPERS_ENDED])
            | Q(pk__in=one_off.values("pk")[:1])
        ).order_by(*newest_first)
    )


def _oldest_expired_seconds(now: datetime, using: str) -> float | None:
    """How long the longest-expired in-progress lease has waited (the `in_progress` index)."""
    oldest = (
        WorkItem.objects.using(using)
        .in_progress()
        .filter(lease_expires_at__lt=now)  # the health's own instant, as `age` reads it
        .aggregate(oldest=Min("lease_expires_at"))["oldest"]
    )
    return age(now, oldest)


def sweep_health(*, now: datetime | None = None, using: str = "default") -> SweepHealth:
    now = now or database_now(using)
    rows = _sweeper_rows(using)
    sweepers = sorted((_process(r, now) for r in rows), key=lambda s: not s.liveness.silent)
    # A sweep process that stopped or was lost makes no more passes, whatever its last one.
    judged = [s for s in sweepers if s.status in ALIVE_STATUSES or records_passes(s)]
    freshest = _freshest(judged)
    newest = _freshest(sweepers)  # also of stopped processes: the metric's "last scan"
    ended: ProcessInfo | None = None
    if freshest is None:
        interval = (
            get_settings().sweep_interval if newest is None else newest.liveness.interval_seconds
        )
        since = None
    else:
        interval = freshest.liveness.interval_seconds
        since = freshest.seconds_since_scan
    threshold = SILENT_AFTER * interval
    dead = since is None or since > threshold
    if since is None and sweepers and not judged:
        ok = False
        ended = max(sweepers, key=lambda s: s.ended_at)
        how = "was lost" if ended.status == WorkerStatus.LOST else "stopped"
        last_pass = None if newest is None else newest.seconds_since_scan
        last = "" if last_pass is None else f", the last pass {duration(last_pass)} ago"
        message = (
            f"No recovery sweep is running: every sweep process stopped or was lost (the last, "
            f"{ended.worker_id}, {how} {duration(age(now, ended.ended_at) or 0.0)} ago{last}); "
            "expired leases are not being recovered. Start `manage.py recoverysweep` "
            "(or schedule it)."
        )
    elif since is None and newest is not None:
        ok = False
        message = (
            "The running recovery sweep has recorded no pass yet (the last pass, "
            f"{duration(newest.seconds_since_scan or 0.0)} ago, was by a sweep that has stopped): "
            "expired leases are not being recovered until it makes one."
        )
    elif since is None:
        ok = False
        message = (
            "No recovery sweep has ever run: expired leases are not being recovered. "
            "Start `manage.py recoverysweep` (or schedule it with django-q2)."
        )
    elif since > threshold:
        ok = False
        message = (
            f"No recovery sweep for {duration(since)} (more than {SILENT_AFTER} of its "
            f"{duration(interval)} intervals): the watchdog looks dead, expired leases pile up."
        )
    elif since > OK_INTERVALS * interval:
        ok = False
        message = (
            f"The last recovery sweep was {duration(since)} ago, later than expected "
            f"(it runs every {duration(interval)}): expired leases wait until it runs again."
        )
    else:
        ok = True
        message = f"Last sweep {duration(since)} ago (it runs every {duration(interval)})."
    # A pass on time is not enough: it must also have worked and kept up.
    errors = _errors(freshest)
    waited = _oldest_expired_seconds(now, using)
    state = "ok" if ok else "dead" if dead else "late"
    if ok and errors:
        ok, state = False, "errors"
        message = (
            f"The last recovery sweep pass, {duration(since or 0.0)} ago, ended with {errors:,} "
            f"error{'s' if errors != 1 else ''}: part of it (recovering expired leases, marking "
            "silent processes lost, retention) may not have run; the sweep's log says why."
        )
    elif ok and waited is not None and waited > KEEP_UP_INTERVALS * interval:
        ok, state = False, "behind"
        message = (
            f"The recovery sweep passes (the last {duration(since or 0.0)} ago) but does not keep "
            f"up: a lease expired {duration(waited)} ago is still not recovered (more than "
            f"{KEEP_UP_INTERVALS} of its {duration(interval)} intervals)."
        )
    # What the last pass left behind stays true after its process stopped.
    stats = (newest.last_scan_stats if newest is not None else None) or {}
    unrecovered = stats.get("unrecovered") or ()
    return SweepHealth(
        sweepers=tuple(sweepers),
        last_scan_at=None if newest is None else newest.last_scan_at,
        seconds_since_last_scan=None if newest is None else newest.seconds_since_scan,
        interval_seconds=interval,
        threshold_seconds=threshold,
        ok=ok,
        message=message,
        unrecovered=tuple(str(i) for i in unrecovered if isinstance(i, str))[:20],
        dead=dead,
        ended=ended,
        last_pass_errors=errors,
        oldest_expired_seconds=waited,
        state=state,
    )


def _errors(sweeper: ProcessInfo | None) -> int:
    """The errors `sweeper`'s last pass recorded in its stats (0: none, or no pass)."""
    value = ((sweeper.last_scan_stats if sweeper is not None else None) or {}).get("errors")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _freshest(sweepers: list[ProcessInfo]) -> ProcessInfo | None:
    """The sweeper with the newest pass; None if none has passed."""
    scanned = [(s.last_scan_at, s) for s in sweepers if s.last_scan_at is not None]
    return max(scanned, key=lambda pair: pair[0])[1] if scanned else None


# --- workers and the leases they hold ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HolderLeases:
    """Leases held by an id that has no live row in `workers` (a process that vanished)."""

    lease_holder: str
    lease_count: int
    expired_lease_count: int
    lease_ids: tuple[str, ...]
    lease_expires_in: tuple[float, ...] = ()

    @property
    def leases(self) -> tuple[tuple[str, float], ...]:
        return tuple(zip(self.lease_ids, self.lease_expires_in, strict=False))


LEASE_IDS_SHOWN = 3
# The running and stopping workers `live_workers` reads.
WORKERS_LISTED = 200


def live_workers(
    *, now: datetime | None = None, using: str = "default"
) -> tuple[tuple[ProcessInfo, ...], tuple[HolderLeases, ...]]:
    """Running and stopping workers with the leases they hold, dead holders first.

    One pass over the in-progress rows gives each holder's lease count, its
    expired leases and its first `LEASE_IDS_SHOWN` leases (soonest to expire
    first). Those rows are bounded by the workers' total concurrency, so
    numbering them with window functions is cheap. A holder that is not a
    running worker (its row lost, stopped or silent) stays listed, red and
    first, until the sweep has recovered its leases; a holder with no row
    at all is an orphan.
    """
    now = now or database_now(using)
    partition: dict[str, Any] = {"partition_by": [F("lease_holder")]}
    leases = (
        WorkItem.objects.using(using)
        .in_progress()
        .annotate(
            position=Window(
                RowNumber(),
                order_by=[F("lease_expires_at").asc(), F("work_item_id").asc()],
                **partition,
            ),
            held=Window(Count("*"), **partition),
            held_expired=Window(
                Sum(Case(When(lease_expires_at__lt=Now(), then=1), default=0)), **partition
            ),
        )
        .filter(position__lte=LEASE_IDS_SHOWN)
        .order_by("lease_holder", "position")
        .values_list("lease_holder", "work_item_id", "held", "held_expired", "lease_expires_at")
    )
    per_holder: dict[str, dict[str, int]] = {}
    ids: dict[str, list[str]] = defaultdict(list)
    expiries: dict[str, list[float]] = defaultdict(list)
    for holder, item_id, held, held_expired, expires_at in leases:
        assert holder is not None  # CHECK work_items_in_progress_has_lease
        per_holder[holder] = {"n": held, "expired": held_expired or 0}
        ids[holder].append(item_id)
        assert expires_at is not None  # CHECK work_items_in_progress_has_lease
        expiries[holder].append((expires_at - now).total_seconds())

    def with_leases(row: Worker) -> ProcessInfo:
        held = per_holder.pop(row.worker_id, None)
        return _process(
            row,
            now,
            lease_count=held["n"] if held else 0,
            expired_lease_count=held["expired"] if held else 0,
            lease_ids=tuple(ids.get(row.worker_id, ())),
            lease_expires_in=tuple(expiries.get(row.worker_id, ())),
        )

    rows = list(
        Worker.objects.using(using)
        .workers()
        .alive()
        .order_by("hostname", "worker_id")[:WORKERS_LISTED]
    )
    workers = [with_leases(row) for row in rows]
    # Holders whose row says they are gone: shown until their leases are recovered.
    gone = Worker.objects.using(using).filter(worker_id__in=list(per_holder)[:200])
    workers += [with_leases(row) for row in gone.order_by("hostname", "worker_id")]
    orphans = tuple(
        HolderLeases(
            lease_holder=holder,
            lease_count=row["n"],
            expired_lease_count=row["expired"],
            lease_ids=tuple(ids.get(holder, ())),
            lease_expires_in=tuple(expiries.get(holder, ())),
        )
        for holder, row in sorted(per_holder.items())
    )
    # Problem rows first: holders of at-risk leases, then silent workers, then
    # any with expired leases, then the others in host order.
    workers.sort(key=lambda w: (not w.leases_at_risk, not w.liveness.silent, not w.problem))
    return tuple(workers), orphans


def live_holder_ids(workers: tuple[ProcessInfo, ...]) -> list[str] | None:
    """The ids of the workers alive now, from `live_workers`' rows (the holders
    `leases.lease_health` judges leases by, read once for the page); None when it read
    as many running or stopping workers as it lists, and others may be alive."""
    listed = [
        w
        for w in workers
        if w.role == WorkerRole.WORKER and w.status in (WorkerStatus.RUNNING, WorkerStatus.STOPPING)
    ]
    if len(listed) >= WORKERS_LISTED:
        return None
    return [w.worker_id for w in listed if w.liveness.alive]


# --- counters for /metrics -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessCounters:
    """Sums over the `workers` table (all rows, stopped ones included)."""

    items_completed: int
    items_failed: int
    items_recovered: int
    scans: int
    runs_abandoned: int = 0  # every run a worker abandoned (fenced out, thread still running)


def process_counters(*, using: str = "default") -> ProcessCounters:
    row = Worker.objects.using(using).aggregate(
        completed=Sum("items_completed"),
        failed=Sum("items_failed"),
        recovered=Sum("items_recovered", filter=Q(role=WorkerRole.SWEEPER)),
        scans=Sum("scans", filter=Q(role=WorkerRole.SWEEPER)),
        abandoned=Sum("runs_abandoned_total"),
    )
    return ProcessCounters(
        items_completed=int(row["completed"] or 0),
        items_failed=int(row["failed"] or 0),
        items_recovered=int(row["recovered"] or 0),
        scans=int(row["scans"] or 0),
        runs_abandoned=int(row["abandoned"] or 0),
    )


def processes_by_state(*, using: str = "default") -> dict[tuple[str, str], int]:
    """`{(role, status): count}` over the `workers` table."""
    return {
        (row["role"], row["status"]): row["n"]
        for row in Worker.objects.using(using)
        .order_by()
        .values("role", "status")
        .annotate(n=Count("*"))
    }
