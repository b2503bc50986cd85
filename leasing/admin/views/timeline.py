"""A task's checkpoint timeline (`admin:leasing_workitem_timeline`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.http import Http404, HttpRequest
from django.template.response import TemplateResponse

from ...conf import read_alias
from ...console.durations import humanize_seconds
from ...console.timeline import task_timeline
from ...models import CheckpointType, WorkItemStatus
from ..display import multiline_texts, pretty_json
from ..guards import storable
from .common import console_context, render_console

if TYPE_CHECKING:
    from ..options import WorkItemAdmin

REFRESH_SECONDS = 5
UNFINISHED = (WorkItemStatus.PENDING, WorkItemStatus.IN_PROGRESS)


def timeline_view(
    request: HttpRequest, task_id: str, *, model_admin: WorkItemAdmin
) -> TemplateResponse:
    """A task's checkpoints in sequence order, with an expandable snapshot each."""
    context = console_context(model_admin, request, f"Checkpoint timeline: {task_id}")
    if not storable(task_id):
        raise Http404("No task has this id: it contains characters no task id can hold.")
    include_payloads = context["payloads_visible"]
    timeline = task_timeline(task_id, include_payloads=include_payloads, using=read_alias())
    if not timeline.entries and not timeline.items:
        raise Http404(f"No work items or checkpoints for task {task_id!r}.")
    first = timeline.entries[0].created_at if timeline.entries else None
    context |= {
        "timeline": timeline,
        "rows": [
            {
                "entry": entry,
                "offset": humanize_seconds((entry.created_at - first).total_seconds())
                if first
                else "",
                "snapshot": pretty_json(entry.snapshot) if include_payloads else None,
                "texts": multiline_texts(entry.snapshot) if include_payloads else [],
                "metadata": pretty_json(entry.metadata)
                if include_payloads and entry.metadata is not None
                else None,
            }
            for entry in timeline.entries
        ],
        "types": list(CheckpointType.choices),
        # A task still at work refreshes itself; a finished one has nothing new to show.
        "live": any(item.status in UNFINISHED for item in timeline.items),
        "refresh": REFRESH_SECONDS,
    }
    return render_console(
        request, context, "admin/leasing/timeline.html", "admin/leasing/timeline/panels.html"
    )
