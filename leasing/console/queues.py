"""Queues and work types: what waits, what runs, what finished, and who serves it.

One row per (queue, work type) pair with pending or in-flight items or items
finished in the window. A row is *unserved* when it has pending items and no
worker serves it: running, not silent, claiming (not quiet, not stopping, not
past its abandoned-run bound: `ProcessInfo.not_claiming`) and taking its work
type from its queue. That work waits until someone starts a worker for it.

Queries: pending rows through the claim and blocked indexes
(`backlog.pending_pairs`), in-flight rows through the `in_progress` partial
index, finished items of the window from their groups (`console.finished`).
Run durations are the last attempt's (`completed_at - lease_acquired_at`)
of completed items, percentiles from the groups' histograms.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count

from ..conf import get_settings
from ..models import WorkItem, WorkItemStatus
from ..services.rollups import FinishedGroup, finished_groups
from ..states import PauseKind
from .backlog import Pauses, PendingPair, active_pauses, pending_pairs
from .durations import age
from .finished import FinishedWindow, histogram_percentile, merge
from .processes import ProcessInfo
from .retrying import retrying_pairs

ROWS_SHOWN = 200


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One (queue, work type) pair."""

    queue_name: str
    work_type: str
    pending: int = 0
    deferred: int = 0  # not blocked, waiting for their run_after
    blocked: int = 0  # waiting for dependencies
    oldest_pending_age_seconds: float | None = None
    in_flight: int = 0
    completed: int = 0
    failed: int = 0  # failed for good in the window
    # Failed attempts in the window: of the items finished (every retry of a
    # completed item, every attempt of a failed one) and of those retrying.
    failed_attempts: int = 0
    retrying: int = 0  # pending again after failed attempts, last failed in the window
    p50_seconds: float | None = None
    p95_seconds: float | None = None
    live_workers: int = 0  # the workers serving the pair: alive and claiming
    worker_ids: tuple[str, ...] = ()
    # Live workers that take the pair but claim nothing now, with why ("quiet", "stopping").
    not_claiming: int = 0
    not_claiming_ids: tuple[tuple[str, str], ...] = ()
    # The claim gates: pauses and LEASING concurrency limits (None: no limit).
    queue_paused: bool = False
    type_paused: bool = False
    queue_limit: int | None = None
    queue_in_flight: int = 0  # the whole queue's, every work type
    type_limit: int | None = None
    type_in_flight: int = 0  # the whole work type's, every queue

    @property
    def claimable(self) -> int:
        """Due and unblocked, and not held by a pause."""
        return 0 if self.paused else self.pending - self.deferred - self.blocked

    @property
    def held_by_pause(self) -> int:
        return self.pending - self.deferred - self.blocked if self.paused else 0

    @property
    def failure_rate(self) -> float | None:
        """Failed attempts among all attempts that ended (each completed item ended one well)."""
        attempts = self.completed + self.failed_attempts
        return None if attempts == 0 else self.failed_attempts / attempts

    @property
    def unserved(self) -> bool:
        return self.pending > 0 and self.live_workers == 0 and not self.paused

    @property
    def paused(self) -> bool:
        return self.queue_paused or self.type_paused


def takes(process: ProcessInfo, queue_name: str, work_type: str) -> bool:
    """Whether a live worker handles this pair (no queues: every queue), claiming or not."""
    if not process.liveness.alive:
        return False
    return work_type in process.work_types and (not process.queues or queue_name in process.queues)


def serves(process: ProcessInfo, queue_name: str, work_type: str) -> bool:
    """Whether a live worker would claim items of this pair now.

    A quiet or stopping worker, or one past its abandoned-run bound, still
    beats and finishes what it runs, but claims nothing: it serves no pair.
    """
    return takes(process, queue_name, work_type) and process.not_claiming is None


def queue_table(
    *,
    window_start: datetime,
    now: datetime,
    workers: Iterable[ProcessInfo],
    using: str = "default",
    pending: tuple[PendingPair, ...] | None = None,
    finished: FinishedWindow | None = None,
    pauses: Pauses | None = None,
) -> tuple[QueueRow, ...]:
    """Every (queue, work type) pair with work, unserved pairs first, then by backlog.

    `pending`: the pairs' pending items when the caller has read them already
    (`backlog.pending_pairs`); `finished`: the window's finished groups
    (`console.finished`), read here from `window_start` on unless given;
    `pauses`: the active pauses (`backlog.active_pauses`), read here unless given.
    """
    parts: dict[tuple[str, str], dict[str, Any]] = {}

    def row(queue_name: str, work_type: str) -> dict[str, Any]:
        return parts.setdefault(
            (queue_name, work_type), {"queue_name": queue_name, "work_type": work_type}
        )

    for pair in pending_pairs(using=using) if pending is None else pending:
        row(pair.queue_name, pair.work_type).update(
            pending=pair.pending,
            deferred=pair.deferred,
            blocked=pair.blocked,
            oldest_pending_age_seconds=age(now, pair.oldest_claimable_at),
        )
    items = WorkItem.objects.using(using).order_by()
    for r in items.in_progress().values("queue_name", "work_type").annotate(n=Count("*")):
        row(r["queue_name"], r["work_type"])["in_flight"] = r["n"]
    if finished is None:
        finished = FinishedWindow(window_start, tuple(finished_groups(window_start, using=using)))
    _finished(row, finished)
    for names, retried in retrying_pairs(since=window_start, using=using).items():
        fields = row(*names)
        fields["retrying"] = retried["items"]
        fields["failed_attempts"] = fields.get("failed_attempts", 0) + retried["attempts"]
    live = [w for w in workers if w.liveness.alive]
    gates = _gates(parts.values(), active_pauses(using=using) if pauses is None else pauses)
    built = []
    for (queue_name, work_type), values in parts.items():
        serving: list[str] = []
        idle: list[tuple[str, str]] = []  # take the pair, claim nothing (see `serves`)
        for w in live:
            if serves(w, queue_name, work_type):
                serving.append(w.worker_id)
            elif takes(w, queue_name, work_type):
                idle.append((w.worker_id, w.not_claiming or "not claiming"))
        built.append(
            QueueRow(
                **values,
                **gates(queue_name, work_type),
                live_workers=len(serving),
                worker_ids=tuple(serving[:5]),
                not_claiming=len(idle),
                not_claiming_ids=tuple(idle[:5]),
            )
        )
    built.sort(key=lambda r: (not r.unserved, -r.pending, -r.in_flight, r.queue_name, r.work_type))
    return tuple(built[:ROWS_SHOWN])


def _gates(rows: Iterable[dict[str, Any]], paused: Pauses) -> Any:
    """The pause and limit fields of a row, from the active pauses and the settings."""
    conf = get_settings()
    by_queue: dict[str, int] = defaultdict(int)
    by_type: dict[str, int] = defaultdict(int)
    for values in rows:
        by_queue[values["queue_name"]] += values.get("in_flight", 0)
        by_type[values["work_type"]] += values.get("in_flight", 0)

    def gates(queue_name: str, work_type: str) -> dict[str, Any]:
        return {
            "queue_paused": (PauseKind.QUEUE, queue_name) in paused,
            "type_paused": (PauseKind.WORK_TYPE, work_type) in paused,
            "queue_limit": conf.queue_limits.get(queue_name),
            "queue_in_flight": by_queue[queue_name],
            "type_limit": conf.work_type_limits.get(work_type),
            "type_in_flight": by_type[work_type],
        }

    return gates


def _failed_attempts(groups: Iterable[FinishedGroup]) -> int:
    """Failed attempts of finished items: a completed item's retries, a failed item's
    retries and its last attempt."""
    total = 0
    for group in groups:
        if group.status == WorkItemStatus.COMPLETED:
            total += sum(r * n for r, n in group.retries.items())
        elif group.status == WorkItemStatus.FAILED:
            total += sum((r + 1) * n for r, n in group.retries.items())
    return total


def _finished(row: Any, finished: FinishedWindow) -> None:
    """Counts and percentiles per pair from the window's groups (histogram percentiles)."""
    pairs: dict[tuple[str, str], list[FinishedGroup]] = defaultdict(list)
    for group in finished.groups:
        pairs[(group.queue_name, group.work_type)].append(group)
    for (queue_name, work_type), groups in pairs.items():
        histogram = merge(g.run_histogram for g in groups)
        values = row(queue_name, work_type)
        values.update(
            completed=sum(g.items for g in groups if g.status == WorkItemStatus.COMPLETED),
            failed=sum(g.items for g in groups if g.status == WorkItemStatus.FAILED),
            failed_attempts=values.get("failed_attempts", 0) + _failed_attempts(groups),
            p50_seconds=histogram_percentile(histogram, 0.5),
            p95_seconds=histogram_percentile(histogram, 0.95),
        )
