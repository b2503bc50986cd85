"""What every console page needs: permission check and the admin site's context."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.cache import patch_vary_headers

from ..display import payloads_visible

if TYPE_CHECKING:
    from ..options import WorkItemAdmin


def console_context(model_admin: WorkItemAdmin, request: HttpRequest, title: str) -> dict[str, Any]:
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


FRAGMENT_HEADER = "X-Leasing-Fragment"


def render_console(
    request: HttpRequest, context: dict[str, Any], page: str, panels: str
) -> TemplateResponse:
    """The page, or only its panels when the live refresh (leasing/console.js) asks."""
    fragment = bool(request.headers.get(FRAGMENT_HEADER))
    response = TemplateResponse(request, panels if fragment else page, context)
    patch_vary_headers(response, [FRAGMENT_HEADER])
    return response


def ignored_values(form: forms.Form) -> list[str]:
    """`name=value: why` for each value of the address a console form refused (the page
    then uses that setting's default), for `admin/leasing/includes/ignored.html`."""
    if not form.is_bound or form.is_valid():
        return []
    return [
        f"{name}={form.data.get(name, '')}: {' '.join(str(e) for e in errors)}"
        for name, errors in form.errors.items()
    ]
