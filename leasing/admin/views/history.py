"""History and lease analytics (`admin:leasing_workitem_history`): 1 h, 24 h or 7 d."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from django.http import HttpRequest
from django.template.response import TemplateResponse

from ...conf import read_alias
from ...console.backlog import bucket_bounds, throughput
from ...console.charts import throughput_chart
from ...console.finished import finished_window, is_rolled
from ...console.history import PEAK_DAYS, analytics, run_durations
from ...console.plots import WEEKDAYS, duration_chart, heat_map, worker_bars
from ...sql.runner import database_now
from ..forms import WindowForm
from .common import console_context, render_console

if TYPE_CHECKING:
    from ..options import WorkItemAdmin

REFRESH_SECONDS = 60


def history_view(request: HttpRequest, *, model_admin: WorkItemAdmin) -> TemplateResponse:
    context = console_context(model_admin, request, "History and lease analytics")
    form = WindowForm(request.GET or None)
    minutes = form.minutes()
    using = read_alias()
    now = database_now(using)
    start, step, count = bucket_bounds(minutes, now)
    # The last week's finished items, read once: peak hours, and every figure of a day or week.
    week = finished_window(now - timedelta(days=PEAK_DAYS), using=using)
    rolled = week.since(now - timedelta(minutes=minutes)) if is_rolled(minutes) else None
    finished = throughput(window_minutes=minutes, now=now, using=using, finished=rolled)
    durations = run_durations(window_minutes=minutes, now=now, using=using, finished=rolled)
    stats = analytics(window_minutes=minutes, now=now, using=using, week=week)
    context |= {
        "form": form,
        "window_label": WindowForm.WINDOWS[minutes],
        "now": now,
        "rolled_from": None if rolled is None else rolled.start,
        "refresh": REFRESH_SECONDS,
        "throughput": finished,
        "throughput_chart": throughput_chart(finished),
        "durations": durations,
        "duration_chart": duration_chart(durations, start=start, step=step, count=count),
        "stats": stats,
        "worker_chart": worker_bars(stats.per_worker),
        "heat": heat_map(stats.peak),
        "weekdays": WEEKDAYS,
    }
    return render_console(
        request, context, "admin/leasing/history.html", "admin/leasing/history/panels.html"
    )
