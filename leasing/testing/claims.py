"""Why an item a test wanted to run could not be claimed: `NotClaimable`."""

from __future__ import annotations

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
    return NotClaimable(
        head + "a concurrency limit (LEASING['QUEUE_LIMITS'] or ['WORK_TYPE_LIMITS']) is "
        "reached by items in progress.\n  " + describe(item)
    )
