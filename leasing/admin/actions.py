"""The operator actions on work items: force-release, force-fail, retry, cancel, delete,
run now.

Each is guarded by the permission `leasing.force_release_workitem`, and offered
only where it applies: on an item's page, the actions of its status (and run
now only for a deferred item); on the list, those of the status it is
filtered by, or of running items on a lease health filter (every action
when unfiltered: the confirmation page then says which rows each one would
change). Choosing
one shows a confirmation page that asks for a reason and carries each item's
status and lease (token and last heartbeat); confirming calls
`leasing.services.operations.apply_action` once per item, a fenced compare-and-swap
that also writes the `state_transition` checkpoint. An item whose status or
lease token changed meanwhile is skipped and reported, and so is one whose lease
was renewed for the actions that take the lease away (force-release, force-fail).
The admin itself never writes a status.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.contrib import admin, messages
from django.contrib.admin import options as admin_options
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from ..conf import WRITE_DATABASE
from ..exceptions import LeasingError, WorkItemNotFound
from ..models import WorkItem
from ..services import operations
from ..services.dependencies import dependencies_first
from ..states import WorkItemStatus
from . import bulk, display
from .forms import OperatorActionForm
from .guards import refusal_message, unstorable_ids
from .wording import ACTION_TEXT

if TYPE_CHECKING:
    from .options import WorkItemAdmin

Action = operations.Action

OPERATOR_ACTION_LIMIT = 500
# Django 6.1 offers admin actions on the change form too (and a plural label);
# on Django 6.0 they are list actions, and the item page posts them to the list
# from a menu of its own (`WorkItemAdmin._offer_item_actions`).
ActionLocation = getattr(admin_options, "ActionLocation", None)
ACTION_LOCATIONS: dict[str, Any] = (
    {"location": [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]}
    if ActionLocation is not None
    else {}
)
RETURN_FIELD = "_leasing_return_to"
CONFIRM_FIELD = "_leasing_confirm"


def _admin_action(action: str, name: str, description: str, plural: str) -> Any:
    """The admin action `name` (the value the action form posts) running `action`."""

    def run(
        modeladmin: WorkItemAdmin, request: HttpRequest, queryset: QuerySet[WorkItem]
    ) -> HttpResponse | None:
        return operator_action(modeladmin, request, queryset, action)

    run.__name__ = run.__qualname__ = name
    where = {"description_plural": plural, **ACTION_LOCATIONS} if ACTION_LOCATIONS else {}
    return admin.action(permissions=["force_release"], description=description, **where)(run)


force_release_selected = _admin_action(
    Action.FORCE_RELEASE,
    "force_release_selected",
    "Force-release lease (re-queue)",
    "Force-release selected leases (re-queue)",
)
force_fail_selected = _admin_action(
    Action.FORCE_FAIL,
    "force_fail_selected",
    "Force-fail work item",
    "Force-fail selected work items",
)
retry_failed_selected = _admin_action(
    Action.RETRY,
    "retry_failed_selected",
    "Retry failed or cancelled work item",
    "Retry selected failed or cancelled work items",
)
cancel_selected = _admin_action(
    Action.CANCEL,
    "cancel_selected",
    "Cancel work item (a running one is asked to stop)",
    "Cancel selected work items (running ones are asked to stop)",
)
# Not `delete_selected`: Django's own site-wide action of that name deletes through
# the ORM, which an item's audit trail must not (and which is refused here anyway).
delete_items_selected = _admin_action(
    Action.DELETE,
    "delete_items_selected",
    "Delete work item (pending or finished; audited)",
    "Delete selected pending or finished work items (audited)",
)
run_now_selected = _admin_action(
    Action.RUN_NOW,
    "run_now_selected",
    "Run now (a deferred pending item)",
    "Run selected deferred pending items now",
)
ACTION_NAMES = {
    Action.FORCE_RELEASE: force_release_selected.__name__,
    Action.FORCE_FAIL: force_fail_selected.__name__,
    Action.RETRY: retry_failed_selected.__name__,
    Action.CANCEL: cancel_selected.__name__,
    Action.DELETE: delete_items_selected.__name__,
    Action.RUN_NOW: run_now_selected.__name__,
}
ACTIONS_BY_NAME = {name: action for action, name in ACTION_NAMES.items()}
# The actions that take the lease away from its worker: a renewal since the page was
# shown (the worker proved it is alive) skips them. A cancel only asks the run to stop,
# so only a new claim (the token) makes it another item than the one confirmed.
TAKE_THE_LEASE = frozenset({Action.FORCE_RELEASE, Action.FORCE_FAIL})


def offered_for(item: display.ClockedWorkItem) -> list[str]:
    """The actions that apply to this item now (its status; deferred; asked to stop)."""
    deferred = item.run_after is not None and item.run_after > item.db_now
    stopping = item.cancel_requested_at is not None
    return Action.offered(item.status, deferred=deferred, stopping=stopping)


def offered_for_status(status: str | None) -> set[str]:
    """The actions the list offers when filtered by `status` (None or unknown: all)."""
    if status not in WorkItemStatus.values:
        return set(Action.choices)
    # A pending list may hold deferred items, a running one items not yet asked to stop.
    return set(Action.offered(status, deferred=True))


def _safe_return_to(request: HttpRequest, url: str) -> str:
    """`url` if it points back into this site, else ''."""
    allowed = url_has_allowed_host_and_scheme(
        url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return url if allowed else ""


def _selected_ids(
    modeladmin: WorkItemAdmin, request: HttpRequest, queryset: QuerySet[WorkItem], confirming: bool
) -> list[str] | None:
    """The ids to act on, or None (with a message) when the selection is refused."""
    selected = list(dict.fromkeys(request.POST.getlist(ACTION_CHECKBOX_NAME)))
    if unstorable_ids(selected):
        modeladmin.message_user(request, refusal_message("a selected id"), messages.ERROR)
        return None
    if len(selected) > OPERATOR_ACTION_LIMIT:
        modeladmin.message_user(
            request,
            f"Select at most {OPERATOR_ACTION_LIMIT} work items per action; nothing was changed.",
            messages.ERROR,
        )
        return None
    return selected


def operator_action(
    modeladmin: WorkItemAdmin, request: HttpRequest, queryset: QuerySet[WorkItem], action: str
) -> HttpResponse | None:
    """Confirmation page, then one fenced service call per item.

    The selection is re-read by primary key, ignoring the change list's
    filters: an item that stopped matching a filter (a stale lease that got
    renewed) must be reported as skipped, not silently dropped. It is read on
    the primary (never `LEASING["READ_DATABASE"]`): the leases it shows and
    then fences on must be the current ones.
    """
    if not modeladmin.has_force_release_permission(request):
        raise PermissionDenied
    if request.POST.get("select_across") in ("1", "True"):
        return bulk_by_filter(modeladmin, request, queryset, action)
    confirming = request.POST.get(CONFIRM_FIELD) == "yes"
    selected = _selected_ids(modeladmin, request, queryset, confirming)
    if selected is None:
        return None
    items = list(
        modeladmin.get_queryset(request)
        .using(WRITE_DATABASE)
        .filter(pk__in=selected)
        .order_by("-created_at", "-work_item_id")
    )
    found = {item.pk for item in items}
    unknown = [pk for pk in selected if pk not in found]
    if unknown:
        shown = ", ".join(repr(pk) for pk in unknown[:10]) + (" …" if len(unknown) > 10 else "")
        verb = "it was" if len(unknown) == 1 else "they were"
        modeladmin.message_user(
            request, f"No work item with id {shown}; {verb} not changed.", messages.ERROR
        )
    if not items:
        return None

    if not confirming:
        return confirmation_page(modeladmin, request, action, OperatorActionForm(items=items))
    form = OperatorActionForm(request.POST, items=items)
    if form.is_valid():
        apply(modeladmin, request, action, form)
        return_to = _safe_return_to(request, request.POST.get(RETURN_FIELD, ""))
        changelist = reverse(f"{modeladmin.admin_site.name}:leasing_workitem_changelist")
        if action == Action.DELETE and urlsplit(return_to).path != changelist:
            return_to = changelist  # the item's own page is gone with it
        return HttpResponseRedirect(return_to) if return_to else None
    if form.has_token_errors:
        # The hidden fields were altered or lost: nothing is applied, and the
        # page is shown again with the tokens the items have now.
        modeladmin.message_user(
            request,
            "The confirmation page was altered or is incomplete (a status, lease token or "
            "heartbeat missing or malformed); nothing was changed. Review the items and "
            "confirm again.",
            messages.ERROR,
        )
        form = OperatorActionForm(initial={"reason": request.POST.get("reason", "")}, items=items)
    return confirmation_page(modeladmin, request, action, form)


# Query-string keys of the change list that are not filters.
NOT_FILTERS = {"p", "o", "q", "all", "e", "_changelist_filters", "_to_field", "_popup"}


def describe_filter(request: HttpRequest) -> str:
    """The change list's filters in words: `work items with status__exact=failed, q=x`."""
    parts = [f"{k}={v}" for k, v in request.GET.items() if k not in NOT_FILTERS - {"q"}]
    return "work items with " + ", ".join(parts) if parts else "every work item"


def bulk_by_filter(
    modeladmin: WorkItemAdmin, request: HttpRequest, queryset: QuerySet[WorkItem], action: str
) -> HttpResponse | None:
    """ "Select all N": every item matching the change list's filters, up to the bulk limit.

    The confirmation page counts on the list's database (a read replica when
    `LEASING["READ_DATABASE"]` is set); confirming evaluates the filters again
    on the primary, so a replica that lags cannot choose what is changed.
    """
    confirming = request.POST.get(bulk.BULK_FIELD) == "yes"
    if confirming:
        queryset = queryset.using(WRITE_DATABASE)
    selection = bulk.select(queryset, describe_filter(request))
    if confirming:
        reason, form = bulk.confirmed(modeladmin, request, selection)
        if reason is not None:
            bulk.apply(modeladmin, request, action=action, selection=selection, reason=reason)
            return None
    else:
        form = bulk.blank_form(selection)
    # Django dispatches an action only when a row is ticked: one id rides along.
    hidden = {"action": ACTION_NAMES[action], "select_across": "1", "index": "0"}
    if selection.ids:
        hidden[ACTION_CHECKBOX_NAME] = selection.ids[0]
    return bulk.confirmation_page(
        modeladmin,
        request,
        action=action,
        selection=selection,
        form=form,
        post_url=request.get_full_path(),
        hidden=hidden,
        cancel_url=request.get_full_path(),
    )


def confirmation_page(
    modeladmin: WorkItemAdmin, request: HttpRequest, action: str, form: OperatorActionForm
) -> TemplateResponse:
    rows = [
        {
            "item": item,
            "applies": action in offered_for(item),
            "lease_remaining": display.lease_remaining(item),
            "heartbeat_age": display.heartbeat_age(item),
        }
        for item in form.items
    ]
    return_to = _safe_return_to(
        request, request.POST.get(RETURN_FIELD) or request.META.get("HTTP_REFERER", "")
    )
    text = ACTION_TEXT[action]
    site = modeladmin.admin_site
    context = {
        **site.each_context(request),
        "title": f"{text['verb']}: are you sure?",
        "subtitle": None,
        "opts": modeladmin.opts,
        "media": modeladmin.media,
        "action": action,
        "action_name": ACTION_NAMES[action],
        "action_text": text,
        "form": form,
        "rows": rows,
        "applicable": sum(1 for r in rows if r["applies"]),
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        "confirm_field": CONFIRM_FIELD,
        "return_field": RETURN_FIELD,
        "return_to": return_to,
        "changelist_url": reverse(f"{site.name}:leasing_workitem_changelist"),
    }
    request.current_app = site.name
    return TemplateResponse(
        request, "admin/leasing/workitem/operator_action_confirmation.html", context
    )


def apply(
    modeladmin: WorkItemAdmin, request: HttpRequest, action: str, form: OperatorActionForm
) -> None:
    """Call the service for each confirmed item; report and log what happened."""
    reason = form.cleaned_data["reason"]
    actor = request.user.get_username()
    text = ACTION_TEXT[action]
    applied: list[operations.OperatorResult] = []
    leases = form.expected_leases()
    statuses = form.expected_statuses()
    if action == Action.RETRY:  # dependencies first: their dependents follow them
        leases = {i: leases[i] for i in dependencies_first(leases, using=WRITE_DATABASE)}
    for item_id, (token, heartbeat_at) in leases.items():
        try:
            result = operations.apply_action(
                action,
                item_id,
                expected_token=token,
                expected_heartbeat_at=(
                    heartbeat_at if action in TAKE_THE_LEASE else operations.UNCHECKED
                ),
                expected_status=statuses[item_id],
                actor=actor,
                reason=reason,
            )
        except WorkItemNotFound:
            modeladmin.message_user(
                request, f"Work item {item_id} no longer exists; skipped.", messages.ERROR
            )
            continue
        except LeasingError as exc:
            modeladmin.message_user(request, f"{item_id}: not changed ({exc}).", messages.ERROR)
            continue
        if result.applied:
            applied.append(result)
            # Superseded (say by whom), or a force-release cancelled (asked to stop).
            if result.new_status != Action.leaves[action]:
                modeladmin.message_user(request, f"{item_id}: {result.detail}.", messages.WARNING)
            elif result.dependents_failed or result.dependents_still_failed:
                # What it did to (or left for) the items that depend on it.
                modeladmin.message_user(request, f"{item_id}: {result.detail}.", messages.WARNING)
        else:
            modeladmin.message_user(request, f"{item_id} {result.detail}.", messages.WARNING)
    if not applied:
        return
    fresh: dict[str, WorkItem]
    if action == Action.DELETE:  # no row left to read: log the one confirmed
        fresh = {item.pk: item for item in form.items}
    else:
        fresh = (
            WorkItem.objects.using(WRITE_DATABASE)
            .defer("input_data", "output_data")
            .in_bulk([r.work_item_id for r in applied])
        )
    for result in applied:
        obj = fresh.get(result.work_item_id)
        if obj is None:
            continue
        log = f"{text['verb']} ({result.old_status} → {result.new_status}): {reason}"
        if action == Action.DELETE:
            assert request.user.pk is not None  # the admin serves signed-in staff only
            LogEntry.objects.log_actions(request.user.pk, [obj], DELETION, log)
        else:
            modeladmin.log_change(request, obj, log)
    count = len(applied)
    modeladmin.message_user(
        request, f"{count} work item{'s' if count != 1 else ''} {text['done']}.", messages.SUCCESS
    )
