"""The dashboard (`admin:leasing_workitem_dashboard`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from ...conf import WRITE_DATABASE, read_alias
from ...console.charts import retry_chart, throughput_chart
from ...console.dashboard import build_dashboard
from ...console.durations import humanize_seconds
from ...console.tiles import tiles
from ..display import ChangeUrls, pretty_json
from ..forms import DashboardForm
from .common import console_context, ignored_values, render_console

if TYPE_CHECKING:
    from ..options import WorkItemAdmin


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
    context = console_context(model_admin, request, "Leasing dashboard")
    form = DashboardForm(request.GET or None)
    window, refresh = form.settings()
    include_payloads = context["payloads_visible"]
    data = build_dashboard(
        include_payloads=include_payloads,
        window_minutes=window,
        using=read_alias(),
        primary=WRITE_DATABASE,
    )
    item_url = ChangeUrls(model_admin.admin_site.name)
    worker_url = ChangeUrls(model_admin.admin_site.name, "worker")

    def lease_links(holder: str, lease_ids: tuple[str, ...], count: int) -> dict[str, Any]:
        """A row's lease links, and the list of all its leases when it shows only some."""
        more = None
        if count > len(lease_ids):
            more = f"{context['changelist_url']}?{urlencode({'q': holder})}"
        return {
            "leases": [(pk, item_url(pk)) for pk in lease_ids],
            "more_url": more,
            "lease_count": count,
        }

    context |= {
        "ignored": ignored_values(form),
        "data": data,
        "form": form,
        "window": window,
        "window_label": DashboardForm.WINDOWS.get(window, f"{window} min"),
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
            {"process": w, "url": worker_url(w.worker_id)}
            | lease_links(w.worker_id, w.lease_ids, w.lease_count)
            for w in data.workers
        ],
        "orphans": [
            {"holder": h} | lease_links(h.lease_holder, h.lease_ids, h.lease_count)
            for h in data.orphan_holders
        ],
        "stale_after": humanize_seconds(data.lease_health.stale_after_seconds),
        "sweep_since": humanize_seconds(data.sweep.seconds_since_last_scan),
        "pauses_url": reverse(f"{model_admin.admin_site.name}:leasing_workitem_pauses"),
        "can_pause": model_admin.has_force_release_permission(request),
    }
    return render_console(
        request, context, "admin/leasing/dashboard.html", "admin/leasing/dashboard/panels.html"
    )
