"""The workers table in the admin: who runs, what they run, and the quiet and stop actions.

Each row shows the runs a worker reported on its last beat: busy (a handler
runs), idle (free handler threads) and abandoned (fenced out while their
handler thread still runs; see `leasing.worker.slots.AbandonedRuns`).

Quiet (stop claiming, finish the running items) and stop (quiet, then exit as
on SIGTERM) are admin actions guarded by the operator permission
(`leasing.force_release_workitem`). They ask for a reason, write it to the
worker's row with the user's name (`leasing.services.processes.request`) and
to the admin log; the worker reads the request at its next beat.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from ..conf import WRITE_DATABASE, read_alias
from ..console.durations import EMPTY, humanize_seconds
from ..console.liveness import Liveness, liveness
from ..console.processes import sweep_health
from ..exceptions import LeasingError
from ..models import Worker, WorkerRequest, WorkerRole, WorkerStatus, WorkItem
from ..services import processes
from . import display
from .base import ReadOnlyAdmin
from .forms import reason_field
from .guards import refusal_message, unstorable_ids

CONFIRM_FIELD = "_leasing_confirm"
REQUEST_TEXT = {
    WorkerRequest.QUIET: {
        "verb": "Quiet",
        "done": "asked to go quiet",
        "explain": "A quiet worker claims nothing more and finishes the items it runs; it "
        "keeps running (and beating) until it is stopped. It sees the request at its next "
        "beat.",
    },
    WorkerRequest.STOP: {
        "verb": "Stop",
        "done": "asked to stop",
        "explain": "A stopped worker claims nothing more, gives its running items the "
        "shutdown timeout (LEASING['SHUTDOWN_TIMEOUT']) to finish, hands the rest back "
        "without counting an attempt and exits, as on SIGTERM. It sees the request at its "
        "next beat. A service manager that restarts it on any exit (systemd's "
        "Restart=always) starts it again.",
    },
}


class WorkerRequestForm(forms.Form):
    reason = reason_field()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields[
            "reason"
        ].help_text = (
            "Required. Recorded with your user name on the worker's row and in the admin log."
        )


def _request_action(action: str, description: str) -> Any:
    def run(
        modeladmin: WorkerAdmin, request: HttpRequest, queryset: QuerySet[Worker]
    ) -> HttpResponse | None:
        return modeladmin.request_workers(request, queryset, action)

    run.__name__ = run.__qualname__ = f"{action}_selected"
    return admin.action(permissions=["control"], description=description)(run)


quiet_selected = _request_action(WorkerRequest.QUIET, "Quiet worker (stop claiming, finish)")
stop_selected = _request_action(WorkerRequest.STOP, "Stop worker (finish, hand back, exit)")


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = (
        "worker_id",
        "role",
        "status_badge",
        "runs",
        "hostname",
        "pid",
        "last_seen",
        "started",
        "concurrency",
        "items_completed",
        "items_failed",
        "scans",
        "items_recovered",
        "last_scan",
    )
    list_filter = ("role", "status")
    search_fields = ("=worker_id", "=hostname")
    ordering = ("-last_seen_at", "worker_id")
    actions = (quiet_selected, stop_selected)
    detail_fields = (
        "worker_id",
        "role",
        "status_badge",
        "runs",
        "request",
        "last_seen",
        "hostname",
        "pid",
        "started",
        "stopped",
        "concurrency",
        "work_types",
        "queues",
        "held_items",
        "items_completed",
        "items_failed",
        "runs_abandoned_total",
        "scans",
        "items_recovered",
        "last_scan",
        "last_scan_stats",
    )
    started = display.time_column("started_at", "started at")
    stopped = display.time_column("stopped_at", "stopped at")
    last_scan = display.time_column("last_scan_at", "last scan at")
    HELD_ITEMS_SHOWN = 50

    def get_queryset(self, request: HttpRequest) -> QuerySet[display.ClockedWorker]:
        workers: QuerySet[Worker] = super().get_queryset(request)
        return workers.annotate(db_now=Now())

    def has_control_permission(self, request: HttpRequest) -> bool:
        """`leasing.force_release_workitem`: the operator actions, on workers too."""
        return request.user.has_perm(f"{self.opts.app_label}.force_release_workitem")

    def _liveness(self, obj: display.ClockedWorker) -> Liveness:
        return liveness(obj, (obj.db_now - obj.last_seen_at).total_seconds())

    @admin.display(description="status")
    def status_badge(self, obj: display.ClockedWorker) -> SafeString:
        if self._liveness(obj).silent:
            return display.badge("worker", WorkerStatus.LOST, "Silent")
        return display.badge("worker", obj.status, obj.get_status_display())

    @admin.display(description="runs (last beat)")
    def runs(self, obj: display.ClockedWorker) -> SafeString | str:
        """Busy, idle and abandoned runs as of the worker's last beat; quiet if it claims none."""
        if obj.role != WorkerRole.WORKER or obj.status not in (
            WorkerStatus.RUNNING,
            WorkerStatus.STOPPING,
        ):
            return EMPTY
        idle = max(obj.concurrency - obj.runs_busy, 0)
        abandoned = (
            format_html(
                ', <span class="leasing-bad-text" title="fenced out; the handler thread still '
                'runs">{} abandoned</span>',
                obj.runs_abandoned,
            )
            if obj.runs_abandoned
            else ""
        )
        # As the dashboard's row: an operator's request counts from the moment it is made
        # (it is never taken back), before the worker's next beat honours it.
        quiet: SafeString | str
        if obj.requested_action is not None:
            quiet = format_html(
                ' <span class="leasing-badge leasing-worker-stopping" title="asked by {}: {}">'
                "{} requested</span>",
                obj.requested_by,
                obj.request_reason,
                obj.requested_action,
            )
        elif obj.quiet_since is not None:
            quiet = format_html(
                ' <span class="leasing-badge leasing-worker-stopping">{}</span>', "quiet"
            )
        else:
            quiet = ""
        return format_html(
            '<span class="leasing-nowrap">{} busy, {} idle{}</span>{}',
            obj.runs_busy,
            idle,
            abandoned,
            quiet,
        )

    @admin.display(description="operator request")
    def request(self, obj: Worker) -> SafeString | str:
        if obj.requested_action is None:
            return EMPTY
        return format_html(
            "{} by {} at {}: {}",
            obj.get_requested_action_display(),
            obj.requested_by,
            obj.requested_at,
            obj.request_reason,
        )

    @admin.display(description="last seen", ordering="last_seen_at")
    def last_seen(self, obj: display.ClockedWorker) -> SafeString:
        alive = self._liveness(obj)
        css = "leasing-bad-text" if alive.silent else ""
        return format_html(
            '<span class="{}" title="beats every {}; silent after {}">{}</span>',
            css,
            humanize_seconds(alive.interval_seconds),
            humanize_seconds(alive.limit_seconds),
            alive.text,
        )

    @admin.display(description="leases held")
    def held_items(self, obj: display.ClockedWorker) -> SafeString | str:
        held = (
            WorkItem.objects.using(read_alias()).held_by(obj.worker_id).order_by("lease_expires_at")
        )
        ids = list(held.values_list("pk", flat=True)[: self.HELD_ITEMS_SHOWN + 1])
        if not ids:
            return EMPTY
        # As the dashboard and the lease-health filter judge them: nothing renews the
        # leases of a worker that is not alive (silent, lost, stopped), whatever their beat.
        at_risk = ""
        if obj.role != WorkerRole.WORKER or not self._liveness(obj).alive:
            # What follows each expiry: never more hopeful than the sweep's health.
            sweep = sweep_health(using=read_alias())
            fate = f", {sweep.lease_fate}" if sweep.ok else f"; {sweep.lease_fate}"
            at_risk = format_html(
                '<strong class="leasing-bad-text" data-at-risk="yes">{}</strong> ',
                "At risk: this worker is not alive, nothing renews these leases; each "
                f"expires{fate}.",
            )
        links = [display.work_item_link(self.admin_site.name, pk) for pk in ids]
        more = ""
        if len(ids) > self.HELD_ITEMS_SHOWN:
            url = reverse(f"{self.admin_site.name}:leasing_workitem_changelist")
            more = format_html(' <a href="{}?{}">all…</a>', url, urlencode({"q": obj.worker_id}))
        return format_html(
            '{}<span class="leasing-lease-ids">{}</span>{}',
            at_risk,
            format_html_join("", "{}", ((link,) for link in links[: self.HELD_ITEMS_SHOWN])),
            more,
        )

    # --- quiet and stop ----------------------------------------------------------------

    def request_workers(
        self, request: HttpRequest, queryset: QuerySet[Worker], action: str
    ) -> HttpResponse | None:
        """Confirmation page with a reason, then one `processes.request` per worker."""
        selected = list(dict.fromkeys(request.POST.getlist(ACTION_CHECKBOX_NAME)))[:200]
        if unstorable_ids(selected):
            self.message_user(request, refusal_message("a selected id"), messages.ERROR)
            return None
        workers = list(
            Worker.objects.using(WRITE_DATABASE).filter(pk__in=selected).order_by("worker_id")
        )
        if not workers:
            self.message_user(request, "No such worker; nothing was changed.", messages.ERROR)
            return None
        form = WorkerRequestForm(request.POST if request.POST.get(CONFIRM_FIELD) else None)
        if form.is_bound and form.is_valid():
            self._apply(request, workers, action, form.cleaned_data["reason"])
            return None
        return self._confirmation(request, workers, action, form)

    def _apply(self, request: HttpRequest, workers: list[Worker], action: str, reason: str) -> None:
        actor = request.user.get_username()
        text = REQUEST_TEXT[WorkerRequest(action)]
        done = []
        for worker in workers:
            try:
                applied = processes.request(
                    worker.worker_id, action, by=actor, reason=reason, using=WRITE_DATABASE
                )
            except LeasingError as exc:
                self.message_user(
                    request, f"{worker.worker_id}: not changed ({exc}).", messages.ERROR
                )
                continue
            if not applied:
                self.message_user(
                    request,
                    f"{worker.worker_id} was not {text['done']}: it is not a running worker, "
                    "or it was asked to stop already.",
                    messages.WARNING,
                )
                continue
            self.log_change(request, worker, f"{text['verb']} requested: {reason}")
            if worker.status == WorkerStatus.LOST:
                # Kept for a process that comes back (a partition), but nothing reads it now.
                self.message_user(
                    request,
                    f"{worker.worker_id} is lost (the sweep stopped hearing from it): it was "
                    f"{text['done']} all the same, and sees it only if it comes back. Its "
                    "leases are the sweep's to recover.",
                    messages.WARNING,
                )
                continue
            done.append(worker)
        if done:
            count = len(done)
            self.message_user(
                request,
                f"{count} worker{'s' if count != 1 else ''} {text['done']}; each sees it at its "
                "next beat.",
                messages.SUCCESS,
            )

    def _confirmation(
        self, request: HttpRequest, workers: list[Worker], action: str, form: WorkerRequestForm
    ) -> TemplateResponse:
        text = REQUEST_TEXT[WorkerRequest(action)]
        context = {
            **self.admin_site.each_context(request),
            "title": f"{text['verb']} worker{'s' if len(workers) != 1 else ''}: are you sure?",
            "subtitle": None,
            "opts": self.opts,
            "media": self.media,
            "action_text": text,
            "action_name": f"{action}_selected",
            "workers": workers,
            "form": form,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "confirm_field": CONFIRM_FIELD,
            "changelist_url": reverse(f"{self.admin_site.name}:leasing_worker_changelist"),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/leasing/worker/request_confirmation.html", context)
