"""Helpers of the recovery sweep's tests (test_recovery*.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from leasing import RecoverySweep
from leasing.models import Checkpoint, WorkItem
from tests.support.helpers import database_now


def expire(*item_ids: str, seconds_ago: float = 1.0) -> None:
    """Move leases' expiry into the past (database clock) instead of waiting."""
    WorkItem.objects.filter(pk__in=item_ids).update(
        lease_expires_at=database_now() - timedelta(seconds=seconds_ago)
    )


def boundaries(item_id: str) -> list[Checkpoint]:
    return list(
        Checkpoint.objects.filter(work_item_id=item_id, checkpoint_type="error_boundary").order_by(
            "sequence_number"
        )
    )


def sweep(**kwargs: Any) -> RecoverySweep:
    kwargs.setdefault("scan_interval_seconds", 5)
    return RecoverySweep(**kwargs)
