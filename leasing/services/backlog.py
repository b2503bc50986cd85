"""Reads about the pending backlog that a runtime decides on."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.db.models.functions import Now

from ..sql.terms import ClaimFilters


def due_within(seconds: float, filters: ClaimFilters, *, using: str = "default") -> bool:
    """Is a pending item these filters claim due within `seconds` (a retry's backoff, say)?"""
    from ..models import WorkItem  # models load only after django.setup()

    # Blocked items are not due whatever their run_after (and the condition
    # keeps this a scan of the claim index).
    # No run_after: due since its creation, as the claim reads it (sql.limits.AVAILABLE_AT).
    due = (
        WorkItem.objects.using(using)
        .pending()
        .filter(dependencies_left=0)
        .filter(Q(run_after__isnull=True) | Q(run_after__lte=Now() + timedelta(seconds=seconds)))
    )
    if filters.work_types is not None:
        due = due.filter(work_type__in=filters.work_types)
    if filters.queues is not None:
        due = due.filter(queue_name__in=filters.queues)
    if filters.task_ids is not None:
        due = due.filter(task_id__in=filters.task_ids)
    return due.exists()
