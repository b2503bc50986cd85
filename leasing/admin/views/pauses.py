"""Pausing and resuming queues and work types (`admin:leasing_workitem_pauses`).

GET lists the active pauses and the latest pauses and resumes; with
`?action=pause|resume&kind=queue|work_type&name=…` (the dashboard's buttons)
it shows the confirmation form. Only a POST of that form (CSRF-protected,
with a reason) changes anything: through `leasing.services.pauses`, with an
admin log entry naming the reason. Bad input is a message, never a 500.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from ...exceptions import InvalidInput
from ...models import Pause
from ...services import pauses
from ...states import PauseKind
from ..forms import PauseForm
from ..guards import first_unstorable, refusal_message
from .common import console_context

if TYPE_CHECKING:
    from ..options import WorkItemAdmin

HISTORY_ROWS = 50


def _next_url(request: HttpRequest, default: str) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default


def pauses_view(request: HttpRequest, *, model_admin: WorkItemAdmin) -> HttpResponse:
    context = console_context(model_admin, request, "Paused queues and work types")
    site = model_admin.admin_site.name
    pauses_url = reverse(f"{site}:leasing_workitem_pauses")
    can_change = model_admin.has_force_release_permission(request)
    unstorable = first_unstorable(request.GET, request.POST)
    if unstorable:
        model_admin.message_user(request, refusal_message(unstorable), messages.ERROR)
        return HttpResponseRedirect(pauses_url)
    if request.method == "POST":
        if not can_change:
            raise PermissionDenied
        form = PauseForm(request.POST)
        if form.is_valid():
            done = _apply(model_admin, request, form.cleaned_data)
            if done:
                return HttpResponseRedirect(_next_url(request, pauses_url))
        return _confirmation(request, context, form)
    if request.GET.get("action"):
        if not can_change:
            raise PermissionDenied
        form = PauseForm(initial=request.GET.dict())
        probe = PauseForm({**request.GET.dict(), "reason": "-"})
        if not probe.is_valid():
            problems = "; ".join(
                f"{field}: {' '.join(map(str, errors))}" for field, errors in probe.errors.items()
            )
            model_admin.message_user(
                request, f"Nothing to confirm ({problems}); nothing was changed.", messages.ERROR
            )
            return HttpResponseRedirect(pauses_url)
        return _confirmation(request, context, form)
    context |= {
        "active": list(Pause.objects.active().order_by("kind", "name")),
        "history": list(Pause.objects.order_by("-paused_at", "-id")[:HISTORY_ROWS]),
        "history_rows": HISTORY_ROWS,
        "can_change": can_change,
        "kinds": PauseKind.choices,
    }
    return TemplateResponse(request, "admin/leasing/pauses.html", context)


def _confirmation(request: HttpRequest, context: dict[str, Any], form: PauseForm) -> HttpResponse:
    data = form.data if form.is_bound else form.initial
    kind = data.get("kind") or ""
    action = data.get("action", "")
    context |= {
        "form": form,
        "action": action,
        "kind_label": dict(PauseKind.choices).get(kind, kind).lower(),
        "name": data.get("name", ""),
        "next": _next_url(request, ""),
        "cancel_url": _next_url(request, context["dashboard_url"]),
    }
    return TemplateResponse(request, "admin/leasing/pause_confirmation.html", context)


def _apply(model_admin: WorkItemAdmin, request: HttpRequest, data: dict[str, Any]) -> bool:
    action = pauses.pause if data["action"] == "pause" else pauses.resume
    target = {"queue" if data["kind"] == PauseKind.QUEUE else "work_type": data["name"]}
    actor = request.user.get_username()
    try:
        state = action(**target, by=actor, reason=data["reason"])
    except InvalidInput as exc:
        model_admin.message_user(request, f"{exc} Nothing was changed.", messages.ERROR)
        return False
    level = messages.SUCCESS if state.changed else messages.WARNING
    model_admin.message_user(request, state.describe(), level)
    if state.changed:
        row = Pause.objects.filter(kind=data["kind"], name=data["name"]).order_by("-id").first()
        if row is not None:
            verb = "Paused" if state.paused else "Resumed"
            assert request.user.pk is not None  # the admin serves signed-in staff only
            LogEntry.objects.log_actions(
                request.user.pk,
                [row],
                ADDITION if state.paused else CHANGE,
                f"{verb} {row.get_kind_display().lower()} {row.name}: {data['reason']}",
            )
    return True
