"""The admin views of the console: the dashboard and a task's checkpoint timeline.

Both are registered by `WorkItemAdmin.get_urls()` and wrapped in
`AdminSite.admin_view`, so they are staff-only and anonymous users go to the
admin login (`admin:leasing_workitem_dashboard`,
`admin:leasing_workitem_timeline`). They read everything through
`leasing.console` and only build template context here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from ..console.charts import retry_chart, throughput_chart
from ..console.dashboard import build_dashboard
from ..console.durations import humanize_seconds
from ..console.tiles import tiles
from ..console.timeline import task_timeline
from ..models import CheckpointType
from .display import ItemUrls, payloads_visible, pretty_json
from .forms import DashboardForm
from .guards import storable

if TYPE_CHECKING:
    from .options import WorkItemAdmin


def _context(model_admin: WorkItemAdmin, request: HttpRequest, title: str) -> dict[str, Any]:
    """What every console page's template needs from the admin site."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    site = model_admin.admin_site
    request.current_app = site.name
    return {
        **site.each_context(request),
        "title": title,
        "subtitle": None,
        "opts": model_admin.opts,
        "changelist_url": reverse(f"{site.name}:leasing_workitem_changelist"),
        "dashboard_url": reverse(f"{site.name}:leasing_workitem_dashboard"),
        "payloads_visible": payloads_visible(request.user),
    }


def recovery_summary(snapshot: Any) -> str:
    """One line from an error_boundary snapshot (shown only with view_payload)."""
    if not isinstance(snapshot, dict):
        return ""
    error = next(
        (str(snapshot[k]) for k in ("error", "error_message", "message") if snapshot.get(k)), ""
    )
    parts = [error[:200]] if error else []
    if snapshot.get("retry_count") is not None:
        retry = f"retry {snapshot['retry_count']}"
        if snapshot.get("max_retries") is not None:
            retry += f"/{snapshot['max_retries']}"
        if retry not in error:
            parts.append(retry)
    return " · ".join(parts)


def dashboard_view(request: HttpRequest, *, model_admin: WorkItemAdmin) -> TemplateResponse:
    """Lease health, sweep health, workers, retry distribution, throughput, recoveries."""
    context = _context(model_admin, request, "Leasing dashboard")
    form = DashboardForm(request.GET or None)
    window, refresh = form.settings()
    include_payloads = context["payloads_visible"]
    data = build_dashboard(include_payloads=include_payloads, window_minutes=window)
    item_url = ItemUrls(model_admin.admin_site.name)
    context |= {
        "data": data,
        "form": form,
        "window": window,
        "window_label": dict(form.fields["window"].choices).get(window, f"{window} min"),
        "refresh": refresh,
        "tiles": tiles(data, context["changelist_url"]),
        "retry_chart": retry_chart(data.retries),
        "throughput_chart": throughput_chart(data.throughput),
        "recoveries": [
            {
                "entry": entry,
                "item_url": item_url(entry.work_item_id) if entry.work_item_id else None,
                "summary": recovery_summary(entry.snapshot) if include_payloads else None,
                "snapshot": pretty_json(entry.snapshot) if include_payloads else None,
            }
            for entry in data.recoveries
        ],
        "workers": [
            {"process": w, "leases": [(pk, item_url(pk)) for pk in w.lease_ids]}
            for w in data.workers
        ],
        "orphans": [
            {"holder": h, "leases": [(pk, item_url(pk)) for pk in h.lease_ids]}
            for h in data.orphan_holders
        ],
        "stale_after": humanize_seconds(data.lease_health.stale_after_seconds),
        "retries_age": None
        if data.retries_as_of is None
        else humanize_seconds((data.now - data.retries_as_of).total_seconds()),
        "sweep_since": humanize_seconds(data.sweep.seconds_since_last_scan),
    }
    return TemplateResponse(request, "admin/leasing/dashboard.html", context)


def timeline_view(
    request: HttpRequest, task_id: str, *, model_admin: WorkItemAdmin
) -> TemplateResponse:
    """A task's checkpoints in sequence order, with an expandable snapshot each."""
    context = _context(model_admin, request, f"Checkpoint timeline: {task_id}")
    if not storable(task_id):
        raise Http404("No task has this id: it contains characters no task id can hold.")
    include_payloads = context["payloads_visible"]
    timeline = task_timeline(task_id, include_payloads=include_payloads)
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
                "metadata": pretty_json(entry.metadata)
                if include_payloads and entry.metadata is not None
                else None,
            }
            for entry in timeline.entries
        ],
        "types": list(CheckpointType.choices),
    }
    return TemplateResponse(request, "admin/leasing/timeline.html", context)
