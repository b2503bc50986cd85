"""History and lease analytics (`admin:leasing_workitem_history`): 1 h, 24 h or 7 d, of every
queue and work type or of one of each (`?queue=…&work_type=…`)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from django.http import HttpRequest
from django.template.response import TemplateResponse

from ...conf import read_alias
from ...console.backlog import throughput
from ...console.charts import throughput_chart
from ...console.choices import known_queues, known_work_types
from ...console.finished import finished_for, finished_window, is_rolled
from ...console.history import PEAK_DAYS, analytics, run_durations
from ...console.plots import WEEKDAYS, duration_chart, heat_map, worker_bars
from ...console.windows import bucket_bounds
from ...sql.runner import database_now
from ..forms import HistoryForm, WindowForm
from .common import console_context, ignored_values, render_console

if TYPE_CHECKING:
    from ..options import WorkItemAdmin

# Its smallest bucket is a minute wide: a faster refresh shows nothing new.
REFRESH_SECONDS = 15


def history_view(request: HttpRequest, *, model_admin: WorkItemAdmin) -> TemplateResponse:
    context = console_context(model_admin, request, "History and lease analytics")
    using = read_alias()
    now = database_now(using)
    # The last week's finished items, read once: the peak hours, and a day or a week's figures.
    week = finished_window(now - timedelta(days=PEAK_DAYS), using=using)
    form = HistoryForm(
        request.GET or None,
        queues=sorted({*known_queues(using=using), *(g.queue_name for g in week.groups)}),
        work_types=sorted({*known_work_types(using=using), *(g.work_type for g in week.groups)}),
    )
    minutes = form.minutes()
    queue, work_type = form.narrowed_to()
    week = week.only(queue=queue, work_type=work_type)
    start, step, count = bucket_bounds(minutes, now)
    window = finished_for(window_minutes=minutes, now=now, using=using, week=week)
    window = window.only(queue=queue, work_type=work_type)
    finished = throughput(window_minutes=minutes, now=now, using=using, finished=window)
    durations = run_durations(window_minutes=minutes, now=now, using=using, finished=window)
    stats = analytics(window_minutes=minutes, now=now, using=using, week=week, finished=window)
    context |= {
        "ignored": ignored_values(form),
        "form": form,
        "window_label": WindowForm.WINDOWS[minutes],
        "narrowed_to": " · ".join(
            f"{label} {name}"
            for label, name in (("queue", queue), ("work type", work_type))
            if name is not None
        ),
        "now": now,
        "rolled_from": window.start if is_rolled(minutes) else None,
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
