"""Top errors (`admin:leasing_workitem_errors`) and "retry this group".

Items of a window that failed for good, and (unless "final failures only")
items failing but still retrying, grouped by exception type and normalised
message (`leasing.console.failures`). Error text (the group's message, its
distinct raw messages) follows the payload permission like every error on
the console (`display.errors_visible`); without it a group shows its exception
type, counts, work types and items. Retrying a group is a bulk action: a
confirmation page with the count, the items it touches, the bulk limit, and
an audit record per item.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from ...conf import WRITE_DATABASE, read_alias
from ...console.failures import ErrorGroup, error_groups, group_members
from ...models import WorkItem
from ...services.operations import Action
from ...sql.runner import database_now
from .. import bulk
from ..display import ERROR_HIDDEN, ChangeUrls, error_text, errors_visible
from ..forms import WindowForm
from .common import console_context, ignored_values

if TYPE_CHECKING:
    from ..options import WorkItemAdmin

GROUP_KEY = re.compile(r"[0-9a-f]{16}")


# Items listed on the retry-group confirmation page (the count covers them all).
ITEMS_LISTED = 50


def final_only(request: HttpRequest) -> bool:
    """`?final=1`: items failed for good only; anything else: retrying ones too."""
    return request.GET.get("final") == "1"


def errors_view(request: HttpRequest, *, model_admin: WorkItemAdmin) -> TemplateResponse:
    context = console_context(model_admin, request, "Top errors")
    form = WindowForm(request.GET or None)
    minutes = form.minutes()
    using = read_alias()
    final = final_only(request)
    start = database_now(using) - timedelta(minutes=minutes)
    groups, truncated = error_groups(start, using=using, final_only=final)
    item_url = ChangeUrls(model_admin.admin_site.name)
    retry_url = reverse(f"{model_admin.admin_site.name}:leasing_workitem_errors_retry")
    errors_url = reverse(f"{model_admin.admin_site.name}:leasing_workitem_errors")
    context |= {
        "ignored": ignored_values(form),
        "form": form,
        "final_only": final,
        "toggle_url": f"{errors_url}?{urlencode({'window': minutes, 'final': int(not final)})}",
        "window_label": WindowForm.WINDOWS[minutes],
        "errors_visible": errors_visible(request.user),
        "error_hidden": ERROR_HIDDEN,
        "groups": [
            {
                "group": group,
                "examples": [(pk, item_url(pk)) for pk in group.examples],
                "retry_url": f"{retry_url}?{urlencode({'key': group.key, 'window': str(minutes)})}",
            }
            for group in groups
        ],
        "truncated": truncated,
        "can_retry": model_admin.has_force_release_permission(request),
    }
    return TemplateResponse(request, "admin/leasing/errors.html", context)


def group_label(group: ErrorGroup, visible: bool) -> str:
    """The group as the audit record and the page name it: its message only for
    users who may read error text (the audit log is shown to every viewer)."""
    kind = group.exception_type or "an error without a type"
    if visible:
        return f"“{group.exception_type + ': ' if group.exception_type else ''}{group.message}”"
    return f"{kind} (group {group.key})"


def retry_group_view(request: HttpRequest, *, model_admin: WorkItemAdmin) -> HttpResponse:
    """Confirm, then retry every failed item of one error group (`?key=…&window=…`)."""
    console_context(model_admin, request, "Retry an error group")  # view permission
    if not model_admin.has_force_release_permission(request):
        raise PermissionDenied
    errors_url = reverse(f"{model_admin.admin_site.name}:leasing_workitem_errors")
    form = WindowForm(request.GET)
    minutes = form.minutes()
    errors_url += f"?{urlencode({'window': minutes})}"
    window = WindowForm.WINDOWS[minutes]
    key = request.GET.get("key", "")
    confirming = request.method == "POST" and request.POST.get(bulk.BULK_FIELD) == "yes"
    # The confirmation page's count may come from the read replica; the
    # members a confirmed retry acts on are read again on the primary.
    using = WRITE_DATABASE if confirming else read_alias()
    start = database_now(using) - timedelta(minutes=minutes)
    group = next((g for g in error_groups(start, using=using)[0] if g.key == key), None)
    if not GROUP_KEY.fullmatch(key) or group is None:
        model_admin.message_user(
            request,
            f"No failed item of the last {window} has this error any more; nothing was changed.",
            messages.WARNING,
        )
        return HttpResponseRedirect(errors_url)
    selection = bulk.failed_selection(
        f"failed in the last {window} with {group_label(group, visible=False)}",
        group_members(start, key, bulk.BULK_LIMIT + 1, using=using),
        using=using,
    )
    if confirming:
        reason, confirm = bulk.confirmed(model_admin, request, selection)
        if reason is not None:
            bulk.apply(
                model_admin, request, action=Action.RETRY, selection=selection, reason=reason
            )
            return HttpResponseRedirect(errors_url)
    else:
        confirm = bulk.blank_form(selection)
    return bulk.confirmation_page(
        model_admin,
        request,
        action=Action.RETRY,
        selection=selection,
        form=confirm,
        post_url=request.get_full_path(),
        hidden={},
        cancel_url=errors_url,
        listing=touched_items(selection.ids[:ITEMS_LISTED], request, model_admin, using=using),
    )


def touched_items(
    ids: tuple[str, ...], request: HttpRequest, model_admin: WorkItemAdmin, *, using: str
) -> list[dict[str, Any]]:
    """The items a confirmation will touch: id, type, retries and (if allowed) error."""
    item_url = ChangeUrls(model_admin.admin_site.name)
    rows = (
        WorkItem.objects.using(using)
        .filter(pk__in=ids)
        .order_by("-completed_at", "-work_item_id")
        .values_list("work_item_id", "work_type", "retry_count", "max_retries", "error_message")
    )
    return [
        {
            "id": pk,
            "url": item_url(pk),
            "work_type": work_type,
            "retries": f"{retries}/{budget}",
            "error": error_text(request.user, error),
        }
        for pk, work_type, retries, budget, error in rows
    ]
