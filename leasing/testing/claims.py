"""Why an item a test wanted to run could not be claimed: `NotClaimable`."""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from ..services.dependencies import waiting_on
from ..states import PauseKind, WorkItemStatus
from .assertions import describe


class NotClaimable(AssertionError):
    """The item a test asked to run is not one a worker could claim now."""


def not_claimable(
    item_id: str, using: str, *, missing: bool = False, first: str | None = None
) -> NotClaimable:
    """The error saying why `item_id` was not claimed, read from the database now."""
    from ..models import Pause, WorkItem

    item = None if missing else WorkItem.objects.using(using).filter(pk=item_id).first()
    if item is None:
        return NotClaimable(f"There is no work item {item_id!r}.")
    head = f"Work item {item_id} cannot be claimed now: "
    if first is not None:
        return NotClaimable(
            head + f"{first} (the same task, work type and queue) comes first in claim "
            "order. Run that one first, or drain(task_id=...) to run them all.\n  " + describe(item)
        )
    if item.status != WorkItemStatus.PENDING:
        return NotClaimable(head + f"it is {item.status}.\n  " + describe(item))
    if item.dependencies_left:
        waiting = waiting_on(item_id, using=using)
        unfinished = [
            f"{linked.work_item_id} ({linked.status})"
            for linked in waiting.items
            if linked.status != WorkItemStatus.COMPLETED
        ]
        return NotClaimable(
            head
            + "it waits on dependencies that have not completed: "
            + ", ".join(unfinished)
            + ". Run them first, or drain() to run them in order."
        )
    if WorkItem.objects.using(using).filter(pk=item_id).deferred().exists():
        return NotClaimable(
            head + f"it is scheduled for {item.run_after.isoformat() if item.run_after else '?'}"
            " (a run_after, or a retry's backoff). drain(include_scheduled=True) runs it "
            "as if it were due."
        )
    pauses = (
        Pause.objects.using(using)
        .active()
        .filter(
            Q(kind=PauseKind.QUEUE, name=item.queue_name)
            | Q(kind=PauseKind.WORK_TYPE, name=item.work_type)
        )
    )
    for active in pauses:
        label = active.get_kind_display().lower()
        return NotClaimable(
            head + f"the {label} {active.name!r} is paused (by {active.paused_by}: "
            f"{active.reason}); leasing.resume() it first."
        )
    closed = _closed_bucket(item, using)
    if closed is not None:
        return NotClaimable(
            head + f"its rate limit's bucket {closed!r} admits nothing more for now "
            "(LEASING['RATE_LIMITS'] or the enqueue's rate_limit); it waits, pending.\n  "
            + describe(item)
        )
    return NotClaimable(
        head + "a concurrency limit (LEASING['QUEUE_LIMITS'] or ['WORK_TYPE_LIMITS']) is "
        "reached by items in progress.\n  " + describe(item)
    )


def _closed_bucket(item: Any, using: str) -> str | None:
    """The first of the item's rate limit buckets that is closed at the database clock."""
    from ..services.rate_limits import buckets_of
    from ..sql.runner import run_one
    from ..storage import storage_for

    d = storage_for(using)
    names = buckets_of((item.pk, item.queue_name, item.work_type, item.rate_key))
    condition, params = d.one_of("bucket", names)
    row = run_one(
        using,
        (
            f"SELECT bucket FROM leasing_rate_buckets WHERE {condition} "
            f"AND next_at > {d.epoch(d.now)} ORDER BY bucket",
            params,
        ),
    )
    return None if row is None else str(row["bucket"])
