"""Helpers of the db tier that claim and end items through the public API: one place
for what several test files of a feature (its own file and its `_meets` file) share."""

from __future__ import annotations

from typing import Any

from leasing import Lease, LeaseManager, WorkContext
from leasing.models import WorkItem


def get(item: Any) -> WorkItem:
    """The item's row as it is now (`item`: a WorkItem, or its id)."""
    return WorkItem.objects.get(pk=getattr(item, "pk", item))


def claimable_ids() -> set[str]:
    return set(WorkItem.objects.claimable().values_list("pk", flat=True))


def claim(worker: str = "w") -> Lease:
    """The next item's lease, held for a minute by `worker`."""
    lease = LeaseManager(worker).acquire_lease(lease_duration_seconds=60)
    assert lease is not None
    return lease


def context(lease: Lease) -> WorkContext:
    """A handler's context for `lease`, with no heartbeat thread."""
    return WorkContext(lease, heartbeat=None)  # type: ignore[arg-type]


def run_item(item: Any, *, success: bool = True, manager: LeaseManager | None = None) -> None:
    """Claim exactly this item and end it (retry=False: a failure is for good)."""
    manager = manager or LeaseManager("w1")
    lease = manager.acquire_lease(60, task_id_filter=get(item).task_id)
    assert lease is not None and lease.work_item_id == get(item).pk, "the item was not claimable"
    manager.release_lease(lease.work_item_id, success=success, error=None if success else "boom")
