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
from ...console.strip import status_strip
from ...console.tiles import tiles
from ..display import ChangeUrls, errors_visible, pretty_json
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


# Healthy workers listed before the rest fold away (problem rows are always listed).
WORKERS_SHOWN = 10


def fold_workers(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every problem row, then the first `WORKERS_SHOWN` healthy ones; the rest folded."""
    problems = [r for r in rows if r["process"].problem]
    healthy = [r for r in rows if not r["process"].problem]
    return {
        "workers": problems + healthy[:WORKERS_SHOWN],
        "folded_workers": healthy[WORKERS_SHOWN:],
        "workers_shown": WORKERS_SHOWN,
    }


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

    def lease_links(
        holder: str, leases: tuple[tuple[str, float], ...], count: int, *, at_risk: bool
    ) -> dict[str, Any]:
        """A row's lease links, and the list of all its leases when it shows only some.

        At risk (nothing renews them): each lease says when it expires."""
        more = None
        if count > len(leases):
            more = f"{context['changelist_url']}?{urlencode({'q': holder})}"
        return {
            "leases": [(pk, item_url(pk), expires_in) for pk, expires_in in leases],
            "more_url": more,
            "lease_count": count,
            "at_risk": at_risk,
        }

    context |= {
        "ignored": ignored_values(form),
        "data": data,
        "form": form,
        "window": window,
        "window_label": DashboardForm.WINDOWS.get(window, f"{window} min"),
        "refresh": refresh,
        "tiles": tiles(data, context["changelist_url"]),
        "strip": status_strip(
            data,
            context["changelist_url"],
            reverse(f"{model_admin.admin_site.name}:leasing_workitem_pauses"),
        ),
        "retry_chart": retry_chart(data.retries),
        "throughput_chart": throughput_chart(data.throughput),
        "recoveries": [
            {
                "entry": entry,
                "item_url": item_url(entry.work_item_id) if entry.work_item_id else None,
                "summary": recovery_summary(entry.snapshot)
                if errors_visible(request.user)
                else None,
                "snapshot": pretty_json(entry.snapshot) if include_payloads else None,
            }
            for entry in data.recoveries
        ],
        **fold_workers(
            [
                {"process": w, "url": worker_url(w.worker_id)}
                | lease_links(w.worker_id, w.leases, w.lease_count, at_risk=w.leases_at_risk)
                for w in data.workers
            ]
        ),
        "at_risk_holders": len(data.orphan_holders)
        + sum(1 for w in data.workers if w.leases_at_risk),
        "orphans": [
            {"holder": h} | lease_links(h.lease_holder, h.leases, h.lease_count, at_risk=True)
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
