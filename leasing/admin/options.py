"""The ModelAdmins of the four leasing tables.

* Work items are read-only rows with three operator actions (see
  `leasing.admin.actions`); the dashboard and the per-task checkpoint
  timeline are admin views of `WorkItemAdmin` (`leasing.admin.views`).
* Checkpoints, idempotency keys and workers are read-only.
* Payloads (`input_data`, `output_data`, `snapshot_data`, `metadata`,
  `response_data`) are shown only to users with `leasing.view_payload`; no
  search looks inside them.
* Lists are built for tables of millions of rows: counts stop at
  `EstimatedCountPaginator.exact_limit` and fall back to the planner's
  estimate, searches are exact matches on indexed columns, and the date
  hierarchy of a large list is derived from the bounds of the index.
* Input the database cannot store (a NUL byte in an id, a filter or a
  selected row) is refused with a message before any query (`base`).
* A database that does not answer (`LEASING["READ_DATABASE"]`, the primary)
  makes any of their pages a 503 page saying which and why (`base.ReadOnlyAdmin`).
"""

from __future__ import annotations

from functools import partial
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from .. import tracing
from ..conf import get_settings, read_alias
from ..console.durations import EMPTY
from ..console.failures import item_failures
from ..models import Checkpoint, IdempotencyKey, WorkItem, WorkItemStatus
from ..services.dependencies import dependents_of, waiting_on
from . import actions, display, payload_search, views
from .base import ReadOnlyAdmin, WorkItemLinkColumn
from .filters import (
    LeaseHealthFilter,
    QueueFilter,
    RetryingFilter,
    StatusFilter,
    WorkTypeFilter,
)

# --- work items -------------------------------------------------------------------------------

# The dependencies and dependents an item's page lists (the others are counted).
DEPENDENCIES_SHOWN = 20


@admin.register(WorkItem)
class WorkItemAdmin(ReadOnlyAdmin):
    list_display = (
        "work_item_id",
        "task_link",
        "work_type",
        "queue_name",
        "status_badge",
        "lease_remaining",
        "heartbeat_age",
        "last_progress",
        "retries",
        "lease_holder",
        "created",
    )
    list_filter = (StatusFilter, LeaseHealthFilter, WorkTypeFilter, QueueFilter, RetryingFilter)
    search_fields = ("=work_item_id", "=task_id", "=lease_holder")
    search_columns = ("work_item_id", "task_id", "lease_holder")
    search_upper = ("work_item_id",)
    search_help_text = "Exact work item id, task id or lease holder (several: separate by spaces)."
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-work_item_id")
    # Only columns an index serves over the whole table: sorting a million rows
    # by status or a lease time is a full scan and a sort (seconds). The lease
    # health filter and the dashboard answer "which leases are about to go".
    sortable_by = ("work_item_id", "created")
    list_per_page = 50
    list_max_show_all = 200
    actions = (
        actions.force_release_selected,
        actions.force_fail_selected,
        actions.retry_failed_selected,
        actions.cancel_selected,
        actions.delete_items_selected,
        actions.run_now_selected,
    )

    list_refresh_seconds = 5  # the list refreshes itself in place (leasing/console.js)
    payload_search = True  # ?input__key=value (leasing.admin.payload_search)
    # Filters whose values are checked before the list is built: a bad one is
    # dropped with a message instead of an empty list or a bare redirect.
    checked_filters = (StatusFilter, LeaseHealthFilter)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        refused = self._refuse_unstorable(request)
        if refused is not None:
            return refused
        ignored = self._drop_bad_filters(request)
        filters, problems = payload_search.parse(request.GET.dict())
        ignored += [f"{p}: not a payload filter" for p in problems]
        if filters and not display.payloads_visible(request.user):
            ignored.append(
                "the payload filter: searching payloads needs the “Can view work item and "
                "checkpoint payloads” permission"
            )
            filters = []
        request.leasing_payload_filters = filters  # type: ignore[attr-defined]
        extra_context = {
            **(extra_context or {}),
            "leasing_refresh": self.list_refresh_seconds,
            "ignored": ignored,
            "payload_search": display.payloads_visible(request.user),
            "payload_form": payload_search.form_values(request.GET.dict()),
        }
        return super().changelist_view(request, extra_context)

    def _drop_bad_filters(self, request: HttpRequest) -> list[str]:
        """Drop the query string's unknown status and lease health values; say which."""
        ignored = []
        params = request.GET.copy()
        for filter_class in self.checked_filters:
            spec = filter_class(request, dict(request.GET.lists()), self.model, self)
            known = {str(value) for value, _ in spec.lookup_choices}
            names = {filter_class.parameter_name}
            if filter_class is StatusFilter:
                names.add("status")  # the column itself, a lookup Django allows
            for name in sorted(names & set(params)):
                if params[name] not in known:
                    ignored.append(f"{name}={params[name]}: not one of {', '.join(sorted(known))}")
                    del params[name]
        if ignored:
            params._mutable = False
            request.GET = cast(Any, params)
        return ignored

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        """On the list, only the actions that apply to the status it is filtered by."""
        found = (
            super().get_actions(request)
            if action_location is None
            else super().get_actions(request, action_location=action_location)
        )
        if actions.ActionLocation is not None and action_location not in (
            None,
            actions.ActionLocation.CHANGE_LIST,
        ):
            return found  # the item page narrows them to its item (render_change_form)
        status = request.GET.get(StatusFilter.parameter_name)
        if status is None and request.GET.get(LeaseHealthFilter.parameter_name):
            status = WorkItemStatus.IN_PROGRESS  # every lease health is of a running item
        offered = actions.offered_for_status(status)
        return {
            name: action
            for name, action in found.items()
            if actions.ACTIONS_BY_NAME.get(name) in offered
        }

    def has_force_release_permission(self, request: HttpRequest) -> bool:
        """`leasing.force_release_workitem`: the three operator actions."""
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.force_release_{opts.model_name}")

    def get_queryset(self, request: HttpRequest) -> QuerySet[display.ClockedWorkItem]:
        # `db_now` is the database clock for the lease columns; payloads are
        # not loaded unless a page shows them.
        items: QuerySet[WorkItem] = super().get_queryset(request)
        return items.annotate(db_now=Now()).defer("input_data", "output_data", "trace_context")

    # --- columns ---

    def action_checkbox(self, obj: WorkItem) -> SafeString:
        """Django's row checkbox, written directly.

        The stock one renders a form widget through the template engine for
        every row, a large share of a list page's time.
        """
        label = format_html(gettext("Select this object for an action - {}"), str(obj))
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            ACTION_CHECKBOX_NAME,
            obj.pk,
            label,
        )

    @admin.display(description="task")
    def task_link(self, obj: WorkItem) -> SafeString:
        return display.timeline_link(
            self.admin_site.name, obj.task_id, "Checkpoint timeline of this task"
        )

    @admin.display(description="status")
    def status_badge(self, obj: WorkItem) -> SafeString:
        badge = display.badge("status", obj.status, obj.get_status_display())
        if obj.status == WorkItemStatus.IN_PROGRESS and obj.cancel_requested_at is not None:
            # Still running, but not as it was: it is winding down.
            return format_html("{} {}", badge, display.badge("status", "stopping", "asked to stop"))
        if obj.status == WorkItemStatus.PENDING and obj.dependencies_left > 0:
            # Pending, but no worker can claim it: it waits for its dependencies.
            n = obj.dependencies_left
            label = f"waiting for {n} dependenc{'y' if n == 1 else 'ies'}"
            return format_html("{} {}", badge, display.badge("status", "blocked", label))
        return badge

    @admin.display(description="lease remaining")
    def lease_remaining(self, obj: display.ClockedWorkItem) -> SafeString | str:
        return display.lease_remaining(obj)

    @admin.display(description="heartbeat")
    def heartbeat_age(self, obj: display.ClockedWorkItem) -> SafeString | str:
        return display.heartbeat_age(obj)

    @admin.display(description="last progress")
    def last_progress(self, obj: display.ClockedWorkItem) -> str:
        return display.last_progress(obj)

    @admin.display(description="retries")
    def retries(self, obj: WorkItem) -> str:
        return f"{obj.retry_count}/{obj.max_retries}"

    # --- change view ---

    # Times to the second, like the attempts table (Django's format stops at minutes).
    created = display.time_column("created_at", "created at")
    lease_acquired = display.time_column("lease_acquired_at", "lease acquired at")
    lease_expires = display.time_column("lease_expires_at", "lease expires at")
    heartbeat = display.time_column("heartbeat_at", "heartbeat at")
    progress = display.time_column("progress_at", "progress at")
    due = display.time_column("run_after", "run after")
    cancel_requested = display.time_column("cancel_requested_at", "asked to stop at")
    started = display.time_column("started_at", "started at")
    completed = display.time_column("completed_at", "completed at")
    updated = display.time_column("updated_at", "updated at")

    fieldsets = (
        (None, {"fields": ("work_item_id", "task_link", "work_type", "queue_name", "priority",
                           "status_badge")}),
        ("Lease", {"fields": ("lease_holder", "lease_token", "lease_acquired",
                              "lease_expires", "lease_remaining", "heartbeat",
                              "heartbeat_age", "progress", "last_progress")}),
        ("Retries", {"fields": ("retries", "due", "error_message", "cancel_requested")}),
        ("Times", {"fields": ("created", "started", "completed", "updated")}),
    )  # fmt: skip
    readonly_fields = (
        "task_link",
        "status_badge",
        "lease_remaining",
        "heartbeat_age",
        "last_progress",
        "retries",
        "created",
        "lease_acquired",
        "lease_expires",
        "heartbeat",
        "progress",
        "due",
        "cancel_requested",
        "started",
        "completed",
        "updated",
        "trace",
        "waits_for",
        "waited_for_by",
    )
    payload_fields = ("input_payload", "output_payload")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        fieldsets = display.hide_error_fields(list(self.fieldsets), request.user)
        if obj is not None and (obj.on_dependency_failure is not None or obj.has_dependents):
            # It has dependencies (its policy is set with them) or items depend on it.
            fieldsets.append(("Dependencies", {"fields": ("waits_for", "waited_for_by")}))
        if obj is not None and tracing.trace_id(obj.trace_context) is not None:
            fieldsets.append(("Tracing", {"fields": ("trace",)}))
        if display.payloads_visible(request.user):
            fieldsets.append(("Payload", {"fields": self.payload_fields}))
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = [*self.readonly_fields, "error_message_hidden"]
        if display.payloads_visible(request.user):
            fields += self.payload_fields
        return fields

    @admin.display(description="trace")
    def trace(self, obj: WorkItem) -> SafeString | str:
        """The enqueuer's trace id (its runs continue that trace), linked by TRACE_URL."""
        trace_id = tracing.trace_id(obj.trace_context)
        if trace_id is None:
            return EMPTY
        template = get_settings().trace_url
        if template is None:
            return format_html("<code>{}</code>", trace_id)
        return format_html(
            '<a href="{}" rel="noopener"><code>{}</code></a>',
            template.format(trace_id=trace_id),
            trace_id,
        )

    @admin.display(description="waits for")
    def waits_for(self, obj: WorkItem) -> SafeString | str:
        """Its dependencies, unfinished first; a failed or cancelled one said so (it
        never completes unless retried: the item fails with it, or stays blocked)."""
        waiting = waiting_on(obj.pk, limit=DEPENDENCIES_SHOWN, using=read_alias())
        if not waiting.total:
            return EMPTY
        head = f"{waiting.left} of {waiting.total} not completed"
        if waiting.failed and waiting.blocked:
            head += (
                f"; {len(waiting.failed)} failed or cancelled: it stays blocked until "
                f"{'that one is' if len(waiting.failed) == 1 else 'they are'} retried"
            )
        return format_html("{}: {}", head, self._linked(waiting.items, waiting.total))

    @admin.display(description="waited for by")
    def waited_for_by(self, obj: WorkItem) -> SafeString | str:
        dependents = dependents_of(obj.pk, limit=DEPENDENCIES_SHOWN, using=read_alias())
        if not dependents.total:
            return EMPTY
        return format_html(
            "{} item(s): {}", dependents.total, self._linked(dependents.items, dependents.total)
        )

    def _linked(self, items: Any, total: int) -> SafeString:
        links = format_html_join(
            ", ",
            "{} ({})",
            (
                (display.work_item_link(self.admin_site.name, i.work_item_id), i.status)
                for i in items
            ),
        )
        more = total - len(items)
        return format_html("{}{}", links, f", and {more:,} more" if more > 0 else "")

    error_message_hidden = display.error_message_hidden

    input_payload = display.payload_column("input_data", "input data")
    output_payload = display.payload_column("output_data", "output data")

    # --- the dashboard and the timeline ---

    # The console's pages: (route, view, URL name suffix), e.g. leasing_workitem_dashboard.
    console_views = (
        ("dashboard/", views.dashboard_view, "dashboard"),
        ("timeline/<path:task_id>/", views.timeline_view, "timeline"),
        ("errors/", views.errors_view, "errors"),
        ("errors/retry/", views.retry_group_view, "errors_retry"),
        ("history/", views.history_view, "history"),
        ("pauses/", views.pauses_view, "pauses"),
    )

    def console_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path(route, wrap(partial(view, model_admin=self)), name=f"{prefix}_{suffix}")
            for route, view, suffix in self.console_views
        ]

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: WorkItem | None = None,
    ) -> HttpResponse:
        if obj is not None:
            self._offer_item_actions(request, context, obj)
            visible = display.payloads_visible(request.user)
            context["payloads_visible"] = visible
            context["failures"] = item_failures(
                obj, include_payloads=display.errors_visible(request.user), using=read_alias()
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _offer_item_actions(
        self, request: HttpRequest, context: dict[str, Any], obj: WorkItem
    ) -> None:
        """Only what applies to this item now: no "retry" on a running item. On Django 6.1
        the change form's own action menu is narrowed to them; Django 6.0 has no actions
        on the change form, so the item page offers them in a menu of its own
        (`item_actions`), posted to the list as for one ticked row."""
        # get_object() read it through get_queryset(): it has the database clock.
        clocked = cast(display.ClockedWorkItem, obj)
        offered = {actions.ACTION_NAMES[a] for a in actions.offered_for(clocked)}
        action_form = context.get("action_form")
        if action_form is not None:
            field = action_form.fields["action"]
            field.choices = [(n, label) for n, label in field.choices if not n or n in offered]
            if len(field.choices) <= 1:
                context["action_form"] = None  # nothing applies: no empty menu
        elif actions.ActionLocation is None and self.has_force_release_permission(request):
            context["item_actions"] = [
                (name, str(description))
                for name, (_, _, description) in self.get_actions(request).items()
                if name in offered
            ]
            context["action_checkbox_name"] = ACTION_CHECKBOX_NAME


# --- checkpoints, idempotency keys, workers ------------------------------------------------------


@admin.register(Checkpoint)
class CheckpointAdmin(WorkItemLinkColumn, ReadOnlyAdmin):
    list_display = (
        "task_link",
        "sequence_number",
        "type_badge",
        "work_item_link",
        "created",
    )
    list_filter = ("checkpoint_type",)
    search_fields = ("=task_id", "=work_item__work_item_id")
    search_columns = ("task_id", "work_item_id")
    search_upper = ("work_item_id",)
    search_help_text = "Exact task id or work item id (several: separate by spaces)."
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-checkpoint_id")
    sortable_by = ("sequence_number", "created")
    list_per_page = 100
    created = display.time_column("created_at", "created at")
    detail_fields = (
        "checkpoint_id",
        "task_link",
        "sequence_number",
        "type_badge",
        "work_item_link",
        "created",
    )
    payload_fields = ("snapshot_payload", "metadata_payload")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Checkpoint]:
        return super().get_queryset(request).defer("snapshot_data", "metadata")

    @admin.display(description="task", ordering="task_id")
    def task_link(self, obj: Checkpoint) -> SafeString:
        return display.timeline_link(self.admin_site.name, obj.task_id)

    @admin.display(description="type", ordering="checkpoint_type")
    def type_badge(self, obj: Checkpoint) -> SafeString:
        return display.badge("cp", obj.checkpoint_type, obj.get_checkpoint_type_display())

    snapshot_payload = display.payload_column("snapshot_data", "snapshot")
    metadata_payload = display.payload_column("metadata", "metadata")


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(WorkItemLinkColumn, ReadOnlyAdmin):
    list_display = (
        "idempotency_key",
        "status",
        "task_id",
        "work_item_link",
        "created",
        "completed",
        "expires",
    )
    list_filter = ("status",)
    search_fields = ("=idempotency_key", "=task_id")
    search_columns = ("idempotency_key", "task_id")
    search_help_text = "Exact idempotency key or task id."
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-idempotency_key")
    sortable_by = ("idempotency_key", "created", "completed", "expires")
    created = display.time_column("created_at", "created at")
    completed = display.time_column("completed_at", "completed at")
    expires = display.time_column("expires_at", "expires at")
    detail_fields = (
        "idempotency_key",
        "status",
        "task_id",
        "work_item_link",
        "request_hash",
        "created",
        "completed",
        "expires",
    )
    payload_fields = ("response_payload",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[IdempotencyKey]:
        return super().get_queryset(request).defer("response_data")

    response_payload = display.payload_column("response_data", "response data")
