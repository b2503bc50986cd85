"""Views of the operator pages: dashboard, checkpoint timeline and Prometheus metrics.

The dashboard and the timeline are admin views (registered by `WorkItemAdmin.
get_urls()` and wrapped in `AdminSite.admin_view`, so they are staff-only and
anonymous users go to the admin login). They read everything through
`leasing.dashboard` and only turn its results into chart geometry and
template context here. Charts are inline SVG drawn on the server: no CDN, no
JavaScript, and they work offline.
"""

from __future__ import annotations

import hmac
import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib.admin.utils import quote
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from . import dashboard
from .conf import get_settings
from .forms import DashboardForm
from .models import CheckpointType

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

PAYLOAD_PERMISSION = "leasing.view_payload"


def payloads_visible(user: Any) -> bool:
    """Only `leasing.view_payload` holders see input/output data and snapshots."""
    return bool(user.has_perm(PAYLOAD_PERMISSION))


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


# --- chart geometry -----------------------------------------------------------------------------


def nice_ceiling(value: float) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is >= value (axis maximum)."""
    if value <= 1:
        return 1
    exponent = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * exponent >= value:
            return int(step * exponent)
    return int(10 * exponent)  # pragma: no cover


@dataclass(frozen=True, slots=True)
class RetryBar:
    label: str
    retry_count: int
    completed: int
    failed: int
    y: float
    completed_width: float
    failed_x: float
    failed_width: float
    text_x: float
    share: float  # percent of all finished items

    @property
    def caption(self) -> str:
        return f"{self.completed:,} completed · {self.failed:,} failed ({self.share:g} %)"


@dataclass(frozen=True, slots=True)
class RetryChart:
    width: int
    height: int
    bars: tuple[RetryBar, ...]
    label_width: int
    bar_height: int
    total: int


def retry_chart(distribution: dashboard.RetryDistribution) -> RetryChart:
    """Horizontal stacked bars: completed then failed, one row per retry count."""
    label_width, plot_width, row, bar_height = 96, 400, 30, 20
    largest = max(distribution.largest, 1)
    total = max(distribution.completed + distribution.failed, 1)
    bars = []
    for index, bucket in enumerate(distribution.buckets):

        def scaled(n: int) -> float:
            return 0.0 if n == 0 else max(2.0, plot_width * n / largest)

        completed_width = scaled(bucket.completed)
        failed_width = scaled(bucket.failed)
        bars.append(
            RetryBar(
                label=f"{bucket.retry_count} {'retry' if bucket.retry_count == 1 else 'retries'}",
                retry_count=bucket.retry_count,
                completed=bucket.completed,
                failed=bucket.failed,
                y=index * row + 4,
                completed_width=round(completed_width, 1),
                failed_x=round(label_width + completed_width, 1),
                failed_width=round(failed_width, 1),
                text_x=round(label_width + completed_width + failed_width + 6, 1),
                share=round(100 * bucket.total / total, 1),
            )
        )
    return RetryChart(
        width=label_width + plot_width + 290,
        height=max(1, len(bars)) * row + 8,
        bars=tuple(bars),
        label_width=label_width,
        bar_height=bar_height,
        total=distribution.completed + distribution.failed,
    )


@dataclass(frozen=True, slots=True)
class ThroughputColumn:
    start: datetime
    label: str
    show_label: bool
    completed: int
    failed: int
    x: float
    width: float
    completed_y: float
    completed_height: float
    failed_y: float
    failed_height: float


@dataclass(frozen=True, slots=True)
class ThroughputChart:
    width: int
    height: int
    plot_left: int
    plot_top: int
    plot_width: int
    plot_height: int
    baseline: int
    axis_max: int
    gridlines: tuple[tuple[float, int], ...]
    columns: tuple[ThroughputColumn, ...]
    label_y: int


def throughput_chart(data: dashboard.Throughput) -> ThroughputChart:
    """Vertical stacked columns per bucket (completed below, failed on top)."""
    left, top, plot_width, plot_height, bottom = 52, 10, 560, 150, 24
    axis_max = nice_ceiling(data.largest)
    count = max(len(data.buckets), 1)
    slot = plot_width / count
    label_every = max(1, math.ceil(count / 6))
    baseline = top + plot_height
    columns = []
    for index, bucket in enumerate(data.buckets):
        completed_h = plot_height * bucket.completed / axis_max
        failed_h = plot_height * bucket.failed / axis_max
        local = timezone.localtime(bucket.start)
        columns.append(
            ThroughputColumn(
                start=bucket.start,
                label=local.strftime("%H:%M"),
                show_label=index % label_every == 0,
                completed=bucket.completed,
                failed=bucket.failed,
                x=round(left + index * slot + slot * 0.1, 1),
                width=round(slot * 0.8, 1),
                completed_y=round(baseline - completed_h, 1),
                completed_height=round(completed_h, 1),
                failed_y=round(baseline - completed_h - failed_h, 1),
                failed_height=round(failed_h, 1),
            )
        )
    gridlines = tuple(
        (round(baseline - plot_height * fraction, 1), int(axis_max * fraction))
        for fraction in (0, 0.5, 1)
    )
    return ThroughputChart(
        width=left + plot_width + 10,
        height=top + plot_height + bottom,
        plot_left=left,
        plot_top=top,
        plot_width=plot_width,
        plot_height=plot_height,
        baseline=baseline,
        axis_max=axis_max,
        gridlines=gridlines,
        columns=tuple(columns),
        label_y=baseline + 16,
    )


# --- the dashboard ------------------------------------------------------------------------------


class ItemUrls:
    """Admin change URLs of work items, without one `reverse()` per link."""

    MARKER = "__leasing_work_item__"

    def __init__(self, site: str) -> None:
        self._template = reverse(f"{site}:leasing_workitem_change", args=[self.MARKER])

    def __call__(self, pk: str) -> str:
        return self._template.replace(self.MARKER, quote(pk))


@dataclass(frozen=True, slots=True)
class Tile:
    label: str
    value: str
    hint: str
    level: str  # "ok", "warn", "bad" or "info"
    url: str | None = None


def _tiles(data: dashboard.Dashboard, changelist: str) -> list[Tile]:
    health, backlog = data.lease_health, data.backlog
    stale_after = dashboard.humanize_seconds(health.stale_after_seconds)
    oldest = backlog.oldest_age_seconds
    return [
        Tile(
            "Active leases",
            f"{health.active:,}",
            f"{health.healthy:,} healthy · {health.stale_live:,} stale · "
            f"{health.expired:,} expired",
            "info",
            f"{changelist}?status__exact=in_progress",
        ),
        Tile(
            "Stale heartbeats",
            f"{health.stale:,}",
            f"no heartbeat for {stale_after}; {health.stale_live:,} still within their lease",
            "warn" if health.stale else "ok",
            f"{changelist}?lease_health=stale",
        ),
        Tile(
            "Expired, awaiting sweep",
            f"{health.expired:,}",
            "lease ran out; the recovery sweep re-queues or fails them",
            "bad" if health.expired and not data.sweep.ok else ("warn" if health.expired else "ok"),
            f"{changelist}?lease_health=expired",
        ),
        Tile(
            "Pending backlog",
            f"{backlog.pending:,}",
            f"{backlog.claimable:,} claimable · {backlog.deferred:,} waiting for run_after"
            + (f" · {backlog.blocked:,} waiting for dependencies" if backlog.blocked else ""),
            "info",
            f"{changelist}?status__exact=pending",
        ),
        Tile(
            "Oldest pending",
            dashboard.humanize_seconds(oldest),
            "age of the oldest claimable item since it was enqueued"
            if oldest is not None
            else "nothing is waiting",
            "warn" if oldest is not None and oldest > 3600 else "ok",
            f"{changelist}?status__exact=pending",
        ),
        Tile(
            "Alive, no progress",
            f"{health.no_progress:,}",
            f"heartbeat fresh but no handler beat for {stale_after}: possibly stuck",
            "warn" if health.no_progress else "ok",
            f"{changelist}?lease_health=no_progress",
        ),
    ]


def dashboard_view(request: HttpRequest, *, model_admin: ModelAdmin) -> TemplateResponse:
    """Lease health, sweep health, workers, retry distribution, throughput, recoveries."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    form = DashboardForm(request.GET or None)
    window, refresh = form.settings()
    include_payloads = payloads_visible(request.user)
    data = dashboard.build_dashboard(include_payloads=include_payloads, window_minutes=window)
    site = model_admin.admin_site.name
    changelist = reverse(f"{site}:leasing_workitem_changelist")
    item_url = ItemUrls(site)
    workers = [
        {"process": w, "leases": [(pk, item_url(pk)) for pk in w.lease_ids]} for w in data.workers
    ]
    orphans = [
        {"holder": h, "leases": [(pk, item_url(pk)) for pk in h.lease_ids]}
        for h in data.orphan_holders
    ]
    recoveries = [
        {
            "entry": entry,
            "item_url": item_url(entry.work_item_id) if entry.work_item_id else None,
            "summary": _recovery_summary(entry.snapshot) if include_payloads else None,
            "snapshot": pretty_json(entry.snapshot) if include_payloads else None,
        }
        for entry in data.recoveries
    ]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Leasing dashboard",
        "subtitle": None,
        "opts": model_admin.opts,
        "data": data,
        "form": form,
        "window": window,
        "window_label": dict(form.fields["window"].choices).get(window, f"{window} min"),
        "refresh": refresh,
        "tiles": _tiles(data, changelist),
        "retry_chart": retry_chart(data.retries),
        "throughput_chart": throughput_chart(data.throughput),
        "recoveries": recoveries,
        "workers": workers,
        "orphans": orphans,
        "changelist_url": changelist,
        "stale_after": dashboard.humanize_seconds(data.lease_health.stale_after_seconds),
        "retries_age": None
        if data.retries_as_of is None
        else dashboard.humanize_seconds((data.now - data.retries_as_of).total_seconds()),
        "sweep_since": dashboard.humanize_seconds(data.sweep.seconds_since_last_scan),
        "payloads_visible": include_payloads,
    }
    request.current_app = site
    return TemplateResponse(request, "admin/leasing/dashboard.html", context)


def _recovery_summary(snapshot: Any) -> str:
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


# --- the timeline -------------------------------------------------------------------------------


def timeline_view(
    request: HttpRequest, task_id: str, *, model_admin: ModelAdmin
) -> TemplateResponse:
    """A task's checkpoints in sequence order, with an expandable snapshot each."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    include_payloads = payloads_visible(request.user)
    timeline = dashboard.task_timeline(task_id, include_payloads=include_payloads)
    if not timeline.entries and not timeline.items:
        raise Http404(f"No work items or checkpoints for task {task_id!r}.")
    first = timeline.entries[0].created_at if timeline.entries else None
    rows = [
        {
            "entry": entry,
            "offset": dashboard.humanize_seconds((entry.created_at - first).total_seconds())
            if first
            else "",
            "snapshot": pretty_json(entry.snapshot) if include_payloads else None,
            "metadata": pretty_json(entry.metadata)
            if include_payloads and entry.metadata is not None
            else None,
        }
        for entry in timeline.entries
    ]
    site = model_admin.admin_site.name
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Checkpoint timeline: {task_id}",
        "subtitle": None,
        "opts": model_admin.opts,
        "timeline": timeline,
        "rows": rows,
        "types": [(value, label) for value, label in CheckpointType.choices],
        "payloads_visible": include_payloads,
        "changelist_url": reverse(f"{site}:leasing_workitem_changelist"),
        "dashboard_url": reverse(f"{site}:leasing_workitem_dashboard"),
    }
    request.current_app = site
    return TemplateResponse(request, "admin/leasing/timeline.html", context)


# --- Prometheus ---------------------------------------------------------------------------------


def _bearer_token(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip()


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition of the leasing tables, computed at scrape time.

    Access: `Authorization: Bearer <LEASING["METRICS_TOKEN"]>`, or a logged-in
    staff session. A wrong or unexpected token gets 401, a logged-in non-staff
    user 403, and an anonymous browser is sent to the admin login.
    """
    from .metrics import render_latest

    token = _bearer_token(request)
    if token is not None or "Authorization" in request.headers:
        expected = get_settings().metrics_token
        if not expected or not token or not hmac.compare_digest(token, expected):
            response = HttpResponse(
                "Invalid metrics token.\n", status=401, content_type="text/plain; charset=utf-8"
            )
            response["WWW-Authenticate"] = 'Bearer realm="leasing-metrics"'
            return response
    elif not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), reverse("admin:login"))
    elif not (request.user.is_active and request.user.is_staff):
        raise PermissionDenied
    body, content_type = render_latest()
    return HttpResponse(body, content_type=content_type)
