"""The admin of the leasing tables, with the operator dashboard (SPEC §12).

* Work items are read-only rows with three operator actions (force-release,
  force-fail, retry failed) guarded by the custom permission
  `leasing.force_release_workitem`. An action shows a confirmation page that
  asks for a reason and carries each item's lease (token and expiry); the
  service in `leasing.operations` then applies it as a fenced compare-and-swap
  and writes the `state_transition` checkpoint; an item whose lease changed
  meanwhile is skipped and reported. The admin itself never writes a status.
* Checkpoints, idempotency keys and workers are read-only.
* Payloads (`input_data`, `output_data`, `snapshot_data`, `metadata`,
  `response_data`) are shown only to users with `leasing.view_payload`; no
  search looks inside them.
* The dashboard and the per-task checkpoint timeline are admin views of
  `WorkItemAdmin` (`admin:leasing_workitem_dashboard`,
  `admin:leasing_workitem_timeline`), rendered by `leasing.views`.

List pages are built for tables of millions of rows (SPEC §15): counts stop
at `EstimatedCountPaginator.exact_limit` and fall back to the planner's
estimate, searches are exact matches on indexed columns, and the date
hierarchy of a large list is derived from the bounds of the index.
"""

from __future__ import annotations

import calendar
import datetime
import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import ActionLocation, IncorrectLookupParameters
from django.contrib.admin.templatetags.admin_list import date_hierarchy
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Max, Min, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import formats, timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.translation import gettext

from . import dashboard, views
from .conf import get_settings
from .exceptions import LeasingError, WorkItemNotFound
from .forms import OperatorActionForm
from .models import (
    Checkpoint,
    IdempotencyKey,
    LeaseHealth,
    Worker,
    WorkItem,
    WorkItemStatus,
)
from .services import operations

EMPTY = "—"


# --- shared building blocks ---------------------------------------------------------------


class EstimatedCountPaginator(Paginator):
    """A paginator that does not COUNT(*) millions of rows on every list page.

    It counts exactly up to `exact_limit` rows (`SELECT COUNT(*) FROM (... LIMIT
    n + 1)`, cheap whatever the table size); beyond that, on PostgreSQL, it
    takes the row estimate of the planner (`EXPLAIN`), which is within a few
    percent after ANALYZE, and marks the count as an estimate so the page says
    "about". SQLite counts exactly.
    """

    exact_limit = 10_000
    is_estimate = False  # set by `count` when it had to estimate

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        if connections[queryset.db].vendor != "postgresql":
            return queryset.count()
        capped = queryset.order_by().values("pk")[: self.exact_limit + 1].count()
        if capped <= self.exact_limit:
            return capped
        self.is_estimate = True
        return max(self.exact_limit + 1, _planner_rows(queryset))


def _planner_rows(queryset: QuerySet[Any]) -> int:
    """PostgreSQL's estimate of the number of rows a queryset returns."""
    sql, params = queryset.order_by().query.get_compiler(using=queryset.db).as_sql()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str | bytes):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written only by the services: viewable, never added, changed or deleted here."""

    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator

    class Media:
        css = {"all": ["leasing/admin.css"]}

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def exact_search(
    queryset: QuerySet[Any], search_term: str, columns: tuple[str, ...], upper: tuple[str, ...] = ()
) -> QuerySet[Any]:
    """Exact matches of any whitespace-separated term on any of `columns`.

    Django's default search (`icontains`) cannot use an index and would read
    every row; exact matches use the primary key and the indexes on task and
    holder. `upper` columns also match the upper-cased term (ULIDs are
    upper-case; pasted ids are not always).
    """
    terms = [t for t in search_term.replace(",", " ").split() if t][:50]
    if not terms:
        return queryset
    condition = Q()
    for column in columns:
        values = set(terms)
        if column in upper:
            values |= {t.upper() for t in terms}
        condition |= Q(**{f"{column}__in": sorted(values)})
    return queryset.filter(condition)


def payload_html(value: Any) -> SafeString:
    """A payload as indented JSON in a <pre> block (escaped)."""
    if value is None:
        return format_html('<span class="quiet">{}</span>', EMPTY)
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="leasing-json">{}</pre>', text)


def can_view_payload(request: HttpRequest) -> bool:
    return views.payloads_visible(request.user)


def _age_text(seconds: float) -> str:
    return dashboard.humanize_seconds(seconds)


# --- work items: list filters -----------------------------------------------------------------


class LeaseHealthFilter(admin.SimpleListFilter):
    """Healthy / stale heartbeat / expired awaiting sweep, via the `in_progress` partial index."""

    title = "lease health"
    parameter_name = "lease_health"
    NO_PROGRESS = "no_progress"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [*LeaseHealth.choices, (self.NO_PROGRESS, "Alive, no progress")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        if value == self.NO_PROGRESS:
            return queryset.without_progress()
        if value in LeaseHealth.values:
            return queryset.with_lease_health(value)
        raise IncorrectLookupParameters(f"Unknown lease health {value!r}.")


class _KnownValuesFilter(admin.SimpleListFilter):
    """A filter whose choices come from a cheap service call, not SELECT DISTINCT."""

    column = ""
    known: Callable[..., list[str]]

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = list(type(self).known())
        current = self.value()
        if current and current not in values:
            values.append(current)
        return [(v, v) for v in sorted(values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return queryset if value is None else queryset.filter(**{self.column: value})


class WorkTypeFilter(_KnownValuesFilter):
    title = "work type"
    parameter_name = "work_type"
    column = "work_type"
    known = staticmethod(dashboard.known_work_types)


class QueueFilter(_KnownValuesFilter):
    title = "queue"
    parameter_name = "queue_name"
    column = "queue_name"
    known = staticmethod(dashboard.known_queues)


# --- work items: the change list ------------------------------------------------------------------


class WorkItemChangeList(ChangeList):
    """Adds a date hierarchy that stays cheap on large result sets."""

    @cached_property
    def leasing_date_hierarchy(self) -> dict[str, Any] | None:
        """Django's date hierarchy, or one derived from MIN/MAX when the list is large.

        Django's runs `SELECT DISTINCT date_trunc(...)` over the whole result,
        which reads every row of a large list. When the paginator had to
        estimate, the links are generated between the first and last
        `created_at` instead (two index lookups); a period may then be empty.
        """
        if not self.date_hierarchy:
            return None
        if not getattr(self.paginator, "is_estimate", False):
            return date_hierarchy(self)
        return _bounded_date_hierarchy(self)


def _bounded_date_hierarchy(cl: ChangeList) -> dict[str, Any]:
    field_name = cl.date_hierarchy
    field = cl.model._meta.get_field(field_name)
    year_field, month_field, day_field = (f"{field_name}__{p}" for p in ("year", "month", "day"))
    params = cl.params

    def lookup(name: str) -> int | None:
        value = params.get(name)
        if isinstance(value, list):
            value = value[-1] if value else None
        try:
            return int(value) if value is not None else None
        except (TypeError, ValueError):
            return None

    year, month, day = lookup(year_field), lookup(month_field), lookup(day_field)

    def link(filters: dict[str, Any]) -> str:
        return cl.get_query_string(filters, [f"{field_name}__"])

    result: dict[str, Any] = {"show": True, "field_name": field.verbose_name, "back": None}
    if year and month and day:
        date = datetime.date(year, month, day)
        result["back"] = {
            "link": link({year_field: year, month_field: month}),
            "title": capfirst(formats.date_format(date, "YEAR_MONTH_FORMAT")),
        }
        result["choices"] = [{"title": capfirst(formats.date_format(date, "MONTH_DAY_FORMAT"))}]
        return result
    bounds = cl.queryset.aggregate(first=Min(field_name), last=Max(field_name))
    if not bounds["first"] or not bounds["last"]:
        return {"show": False}
    first = timezone.localtime(bounds["first"]).date()
    last = timezone.localtime(bounds["last"]).date()
    if not year and first.year == last.year:
        year = first.year
        if first.month == last.month:
            month = first.month
    if year and month:
        days = range(1, calendar.monthrange(year, month)[1] + 1)
        dates = [datetime.date(year, month, d) for d in days]
        result["back"] = {"link": link({year_field: year}), "title": str(year)}
        result["choices"] = [
            {
                "link": link({year_field: year, month_field: month, day_field: d.day}),
                "title": capfirst(formats.date_format(d, "MONTH_DAY_FORMAT")),
            }
            for d in dates
            if first <= d <= last
        ]
    elif year:
        result["back"] = {"link": link({}), "title": "All dates"}
        result["choices"] = [
            {
                "link": link({year_field: year, month_field: m}),
                "title": capfirst(
                    formats.date_format(datetime.date(year, m, 1), "YEAR_MONTH_FORMAT")
                ),
            }
            for m in range(1, 13)
            if (first.year, first.month) <= (year, m) <= (last.year, last.month)
        ]
    else:
        result["choices"] = [
            {"link": link({year_field: y}), "title": str(y)}
            for y in range(first.year, last.year + 1)
        ]
    return result


# --- work items -------------------------------------------------------------------------------


OPERATOR_ACTION_LIMIT = 500
OPERATOR_LOCATIONS = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]
RETURN_FIELD = "_leasing_return_to"
CONFIRM_FIELD = "_leasing_confirm"


@admin.register(WorkItem)
class WorkItemAdmin(admin.ModelAdmin):
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
        "created_at",
    )
    list_filter = ("status", LeaseHealthFilter, WorkTypeFilter, QueueFilter)
    # Exact matches only (see get_search_results): payloads are never searched.
    search_fields = ("=work_item_id", "=task_id", "=lease_holder")
    search_help_text = "Exact work item id, task id or lease holder (several: separate by spaces)."
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-work_item_id")
    sortable_by = (
        "work_item_id",
        "created_at",
        "status_badge",
        "lease_remaining",
        "heartbeat_age",
        "last_progress",
    )
    list_per_page = 50
    list_max_show_all = 200
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    actions = ("force_release_selected", "force_fail_selected", "retry_failed_selected")

    class Media:
        css = {"all": ["leasing/admin.css"]}

    # --- permissions ---

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # items are enqueued through leasing.enqueue

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # state changes only through the operator actions

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # deleting an item would cascade to its audit trail

    def has_force_release_permission(self, request: HttpRequest) -> bool:
        """`leasing.force_release_workitem`: the three operator actions."""
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.force_release_{opts.model_name}")

    # --- queryset, search, change list ---

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkItem]:
        # `db_now` is the database clock for the lease columns (SPEC §6.4);
        # payloads are not loaded unless a page shows them.
        return (
            super().get_queryset(request).annotate(db_now=Now()).defer("input_data", "output_data")
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WorkItem], search_term: str
    ) -> tuple[QuerySet[WorkItem], bool]:
        columns = ("work_item_id", "task_id", "lease_holder")
        return exact_search(queryset, search_term, columns, upper=("work_item_id",)), False

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return WorkItemChangeList

    # --- columns ---

    def action_checkbox(self, obj: WorkItem) -> SafeString:
        """Django's row checkbox, written directly.

        The stock one renders a form widget through the template engine for
        every row, a fifth of the time of a 50-row list page.
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
        url = reverse(f"{self.admin_site.name}:leasing_workitem_timeline", args=[obj.task_id])
        return format_html(
            '<a href="{}" title="Checkpoint timeline of this task">{}</a>', url, obj.task_id
        )

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: WorkItem) -> SafeString:
        return format_html(
            '<span class="leasing-badge leasing-status-{}">{}</span>',
            obj.status,
            obj.get_status_display(),
        )

    @admin.display(description="lease remaining", ordering="lease_expires_at")
    def lease_remaining(self, obj: WorkItem) -> SafeString | str:
        if obj.status != WorkItemStatus.IN_PROGRESS or obj.lease_expires_at is None:
            return EMPTY
        remaining = (obj.lease_expires_at - obj.db_now).total_seconds()
        if remaining < 0:
            return format_html(
                '<span class="leasing-expired" title="Lease expired; the recovery sweep will '
                're-queue or fail it">expired {} ago</span>',
                _age_text(-remaining),
            )
        return _age_text(remaining)

    @admin.display(description="heartbeat", ordering="heartbeat_at")
    def heartbeat_age(self, obj: WorkItem) -> SafeString | str:
        if obj.heartbeat_at is None or obj.status != WorkItemStatus.IN_PROGRESS:
            return EMPTY
        age = max(0.0, (obj.db_now - obj.heartbeat_at).total_seconds())
        if age > get_settings().stale_heartbeat:
            return format_html(
                '<span class="leasing-stale" title="No heartbeat for more than {}">'
                "{} ago (stale)</span>",
                _age_text(get_settings().stale_heartbeat),
                _age_text(age),
            )
        return f"{_age_text(age)} ago"

    @admin.display(description="last progress", ordering="progress_at")
    def last_progress(self, obj: WorkItem) -> str:
        if obj.progress_at is None:
            return EMPTY
        return f"{_age_text(max(0.0, (obj.db_now - obj.progress_at).total_seconds()))} ago"

    @admin.display(description="retries")
    def retries(self, obj: WorkItem) -> str:
        return f"{obj.retry_count}/{obj.max_retries}"

    # --- change view ---

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        fieldsets: list[Any] = [
            (
                None,
                {
                    "fields": (
                        "work_item_id",
                        "task_link",
                        "work_type",
                        "queue_name",
                        "priority",
                        "status_badge",
                    )
                },
            ),
            (
                "Lease",
                {
                    "fields": (
                        "lease_holder",
                        "lease_token",
                        "lease_acquired_at",
                        "lease_expires_at",
                        "lease_remaining",
                        "heartbeat_at",
                        "heartbeat_age",
                        "progress_at",
                        "last_progress",
                    )
                },
            ),
            ("Retries", {"fields": ("retries", "run_after", "error_message")}),
            (
                "Times",
                {"fields": ("created_at", "started_at", "completed_at", "updated_at")},
            ),
        ]
        if can_view_payload(request):
            fieldsets.append(("Payload", {"fields": ("input_payload", "output_payload")}))
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        fields = (
            "task_link",
            "status_badge",
            "lease_remaining",
            "heartbeat_age",
            "last_progress",
            "retries",
        )
        if can_view_payload(request):
            fields += ("input_payload", "output_payload")
        return fields

    @admin.display(description="input data")
    def input_payload(self, obj: WorkItem) -> SafeString:
        return payload_html(obj.input_data)

    @admin.display(description="output data")
    def output_payload(self, obj: WorkItem) -> SafeString:
        return payload_html(obj.output_data)

    # --- the dashboard and the timeline ---

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path(
                "dashboard/",
                wrap(self.dashboard_view),
                name="{}_{}_dashboard".format(*info),
            ),
            path(
                "timeline/<path:task_id>/",
                wrap(self.timeline_view),
                name="{}_{}_timeline".format(*info),
            ),
            *super().get_urls(),
        ]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        return views.dashboard_view(request, model_admin=self)

    def timeline_view(self, request: HttpRequest, task_id: str) -> HttpResponse:
        return views.timeline_view(request, task_id, model_admin=self)

    # --- operator actions ---

    @admin.action(
        permissions=["force_release"],
        description="Force-release lease (re-queue)",
        description_plural="Force-release selected leases (re-queue)",
        location=OPERATOR_LOCATIONS,
    )
    def force_release_selected(
        self, request: HttpRequest, queryset: QuerySet[WorkItem]
    ) -> HttpResponse | None:
        return self._operator_action(request, queryset, operations.Action.FORCE_RELEASE)

    @admin.action(
        permissions=["force_release"],
        description="Force-fail work item",
        description_plural="Force-fail selected work items",
        location=OPERATOR_LOCATIONS,
    )
    def force_fail_selected(
        self, request: HttpRequest, queryset: QuerySet[WorkItem]
    ) -> HttpResponse | None:
        return self._operator_action(request, queryset, operations.Action.FORCE_FAIL)

    @admin.action(
        permissions=["force_release"],
        description="Retry failed work item",
        description_plural="Retry selected failed work items",
        location=OPERATOR_LOCATIONS,
    )
    def retry_failed_selected(
        self, request: HttpRequest, queryset: QuerySet[WorkItem]
    ) -> HttpResponse | None:
        return self._operator_action(request, queryset, operations.Action.RETRY)

    ACTION_TEXT = {
        operations.Action.FORCE_RELEASE: {
            "verb": "Force-release",
            "done": "force-released",
            "explain": (
                "Each lease is taken from its holder and the item goes back to pending "
                "(not counted as a retry). The old holder's later renewals, checkpoints and "
                "release are refused by the fence."
            ),
        },
        operations.Action.FORCE_FAIL: {
            "verb": "Force-fail",
            "done": "force-failed",
            "explain": "Each pending or leased item is failed for good; its lease is cleared.",
        },
        operations.Action.RETRY: {
            "verb": "Retry",
            "done": "sent back to pending",
            "explain": "Each failed item goes back to pending with a fresh retry budget.",
        },
    }

    def _operator_action(
        self, request: HttpRequest, queryset: QuerySet[WorkItem], action: str
    ) -> HttpResponse | None:
        """Confirmation page, then one fenced service call per item.

        The selection is re-read by primary key, ignoring the change list's
        filters: an item that stopped matching a filter (a stale lease that
        got renewed) must be reported as skipped, not silently dropped.
        """
        if not self.has_force_release_permission(request):
            raise PermissionDenied
        confirming = request.POST.get(CONFIRM_FIELD) == "yes"
        if not confirming and request.POST.get("select_across") in ("1", "True"):
            # "Select all N": the change list's (filtered) queryset, bounded.
            selected = list(
                queryset.order_by().values_list("pk", flat=True)[: OPERATOR_ACTION_LIMIT + 1]
            )
        else:
            # The confirmation page always posts the ids it showed.
            selected = list(dict.fromkeys(request.POST.getlist(ACTION_CHECKBOX_NAME)))
        if len(selected) > OPERATOR_ACTION_LIMIT:
            self.message_user(
                request,
                f"Select at most {OPERATOR_ACTION_LIMIT} work items per action; "
                "nothing was changed.",
                messages.ERROR,
            )
            return None
        items = list(
            self.get_queryset(request)
            .filter(pk__in=selected)
            .order_by("-created_at", "-work_item_id")
        )
        found = {item.pk for item in items}
        unknown = [pk for pk in selected if pk not in found]
        if unknown:
            self.message_user(
                request,
                "No work item with id {}; {} not changed.".format(
                    ", ".join(repr(pk) for pk in unknown[:10])
                    + (" …" if len(unknown) > 10 else ""),
                    "it was" if len(unknown) == 1 else "they were",
                ),
                messages.ERROR,
            )
        if not items:
            return None

        if confirming:
            form = OperatorActionForm(request.POST, items=items)
            if form.is_valid():
                self._apply(request, action, form)
                return_to = request.POST.get(RETURN_FIELD, "")
                if return_to and url_has_allowed_host_and_scheme(
                    return_to, allowed_hosts={request.get_host()}, require_https=request.is_secure()
                ):
                    return HttpResponseRedirect(return_to)
                return None
            if form.has_token_errors:
                # The hidden fields were altered or lost: nothing is applied, and
                # the page is shown again with the tokens the items have now.
                self.message_user(
                    request,
                    "The confirmation page was altered or is incomplete (lease tokens "
                    "missing or not numbers); nothing was changed. Review the items and "
                    "confirm again.",
                    messages.ERROR,
                )
                form = OperatorActionForm(
                    initial={"reason": request.POST.get("reason", "")}, items=items
                )
        else:
            form = OperatorActionForm(items=items)
        return self._confirmation_page(request, action, form, items)

    def _confirmation_page(
        self,
        request: HttpRequest,
        action: str,
        form: OperatorActionForm,
        items: list[WorkItem],
    ) -> TemplateResponse:
        allowed = {
            operations.Action.FORCE_RELEASE: {WorkItemStatus.IN_PROGRESS},
            operations.Action.FORCE_FAIL: {WorkItemStatus.IN_PROGRESS, WorkItemStatus.PENDING},
            operations.Action.RETRY: {WorkItemStatus.FAILED},
        }[action]
        rows = [
            {
                "item": item,
                "applies": item.status in allowed,
                "lease_remaining": self.lease_remaining(item),
                "heartbeat_age": self.heartbeat_age(item),
            }
            for item in items
        ]
        return_to = request.POST.get(RETURN_FIELD) or request.META.get("HTTP_REFERER", "")
        if not url_has_allowed_host_and_scheme(
            return_to, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            return_to = ""
        action_name = {
            operations.Action.FORCE_RELEASE: "force_release_selected",
            operations.Action.FORCE_FAIL: "force_fail_selected",
            operations.Action.RETRY: "retry_failed_selected",
        }[action]
        text = self.ACTION_TEXT[action]
        context = {
            **self.admin_site.each_context(request),
            "title": f"{text['verb']}: are you sure?",
            "subtitle": None,
            "opts": self.opts,
            "media": self.media,
            "action": action,
            "action_name": action_name,
            "action_text": text,
            "form": form,
            "rows": rows,
            "applicable": sum(1 for r in rows if r["applies"]),
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "confirm_field": CONFIRM_FIELD,
            "return_field": RETURN_FIELD,
            "return_to": return_to,
            "changelist_url": reverse(f"{self.admin_site.name}:leasing_workitem_changelist"),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/leasing/workitem/operator_action_confirmation.html", context
        )

    def _apply(self, request: HttpRequest, action: str, form: OperatorActionForm) -> None:
        """Call the service for each confirmed item; report and log what happened."""
        reason = form.cleaned_data["reason"]
        actor = request.user.get_username()
        text = self.ACTION_TEXT[action]
        applied: list[operations.OperatorResult] = []
        for item_id, (token, heartbeat_at) in form.expected_leases().items():
            try:
                result = self._apply_one(action, item_id, token, heartbeat_at, actor, reason)
            except WorkItemNotFound:
                self.message_user(
                    request, f"Work item {item_id} no longer exists; skipped.", messages.ERROR
                )
                continue
            except LeasingError as exc:
                self.message_user(request, f"{item_id}: not changed ({exc}).", messages.ERROR)
                continue
            if result.applied:
                applied.append(result)
            else:
                self.message_user(request, f"{item_id} {result.detail}.", messages.WARNING)
        if applied:
            fresh = WorkItem.objects.defer("input_data", "output_data").in_bulk(
                [r.work_item_id for r in applied]
            )
            for result in applied:
                obj = fresh.get(result.work_item_id)
                if obj is not None:
                    self.log_change(
                        request,
                        obj,
                        f"{text['verb']} ({result.old_status} → {result.new_status}): {reason}",
                    )
            count = len(applied)
            self.message_user(
                request,
                f"{count} work item{'s' if count != 1 else ''} {text['done']}.",
                messages.SUCCESS,
            )

    @staticmethod
    def _apply_one(
        action: str,
        item_id: str,
        token: int,
        heartbeat_at: datetime.datetime | None,
        actor: str,
        reason: str,
    ) -> operations.OperatorResult:
        """One fenced service call: skipped if the lease was re-claimed or renewed."""
        return operations.apply_action(
            action,
            item_id,
            expected_token=token,
            expected_heartbeat_at=heartbeat_at,
            actor=actor,
            reason=reason,
        )


# --- checkpoints ---------------------------------------------------------------------------------


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = (
        "task_link",
        "sequence_number",
        "type_badge",
        "work_item_link",
        "created_at",
    )
    list_filter = ("checkpoint_type",)
    search_fields = ("=task_id", "=work_item__work_item_id")
    search_help_text = "Exact task id or work item id (several: separate by spaces)."
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-checkpoint_id")
    sortable_by = ("sequence_number", "created_at")
    list_per_page = 100

    def get_queryset(self, request: HttpRequest) -> QuerySet[Checkpoint]:
        return super().get_queryset(request).defer("snapshot_data", "metadata")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Checkpoint], search_term: str
    ) -> tuple[QuerySet[Checkpoint], bool]:
        return (
            exact_search(queryset, search_term, ("task_id", "work_item_id"), ("work_item_id",)),
            False,
        )

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = [
            "checkpoint_id",
            "task_link",
            "sequence_number",
            "type_badge",
            "work_item_link",
            "created_at",
        ]
        if can_view_payload(request):
            fields += ["snapshot_payload", "metadata_payload"]
        return fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return self.get_fields(request, obj)

    @admin.display(description="task", ordering="task_id")
    def task_link(self, obj: Checkpoint) -> SafeString:
        url = reverse(f"{self.admin_site.name}:leasing_workitem_timeline", args=[obj.task_id])
        return format_html('<a href="{}">{}</a>', url, obj.task_id)

    @admin.display(description="type", ordering="checkpoint_type")
    def type_badge(self, obj: Checkpoint) -> SafeString:
        return format_html(
            '<span class="leasing-badge leasing-cp-{}">{}</span>',
            obj.checkpoint_type,
            obj.get_checkpoint_type_display(),
        )

    @admin.display(description="work item")
    def work_item_link(self, obj: Checkpoint) -> SafeString | str:
        if not obj.work_item_id:
            return EMPTY
        url = reverse(
            f"{self.admin_site.name}:leasing_workitem_change", args=[quote(obj.work_item_id)]
        )
        return format_html('<a href="{}">{}</a>', url, obj.work_item_id)

    @admin.display(description="snapshot")
    def snapshot_payload(self, obj: Checkpoint) -> SafeString:
        return payload_html(obj.snapshot_data)

    @admin.display(description="metadata")
    def metadata_payload(self, obj: Checkpoint) -> SafeString:
        return payload_html(obj.metadata)


# --- idempotency keys ----------------------------------------------------------------------------


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyAdmin):
    list_display = (
        "idempotency_key",
        "status",
        "task_id",
        "work_item_link",
        "created_at",
        "completed_at",
        "expires_at",
    )
    list_filter = ("status",)
    search_fields = ("=idempotency_key", "=task_id")
    search_help_text = "Exact idempotency key or task id."
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-idempotency_key")
    sortable_by = ("idempotency_key", "created_at", "completed_at", "expires_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[IdempotencyKey]:
        return super().get_queryset(request).defer("response_data")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey], search_term: str
    ) -> tuple[QuerySet[IdempotencyKey], bool]:
        return exact_search(queryset, search_term, ("idempotency_key", "task_id")), False

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = [
            "idempotency_key",
            "status",
            "task_id",
            "work_item_link",
            "request_hash",
            "created_at",
            "completed_at",
            "expires_at",
        ]
        if can_view_payload(request):
            fields.append("response_payload")
        return fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return self.get_fields(request, obj)

    @admin.display(description="work item")
    def work_item_link(self, obj: IdempotencyKey) -> SafeString | str:
        if not obj.work_item_id:
            return EMPTY
        url = reverse(
            f"{self.admin_site.name}:leasing_workitem_change", args=[quote(obj.work_item_id)]
        )
        return format_html('<a href="{}">{}</a>', url, obj.work_item_id)

    @admin.display(description="response data")
    def response_payload(self, obj: IdempotencyKey) -> SafeString:
        return payload_html(obj.response_data)


# --- workers -------------------------------------------------------------------------------------


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = (
        "worker_id",
        "role",
        "status_badge",
        "hostname",
        "pid",
        "last_seen",
        "started_at",
        "concurrency",
        "items_completed",
        "items_failed",
        "scans",
        "items_recovered",
        "last_scan_at",
    )
    list_filter = ("role", "status")
    search_fields = ("=worker_id", "=hostname")
    ordering = ("-last_seen_at", "worker_id")
    readonly_fields = ("status_badge", "last_seen")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Worker]:
        return super().get_queryset(request).annotate(db_now=Now())

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Worker) -> SafeString:
        return format_html(
            '<span class="leasing-badge leasing-worker-{}">{}</span>',
            obj.status,
            obj.get_status_display(),
        )

    @admin.display(description="last seen", ordering="last_seen_at")
    def last_seen(self, obj: Worker) -> str:
        return f"{_age_text(max(0.0, (obj.db_now - obj.last_seen_at).total_seconds()))} ago"


# --- a link to the dashboard from the admin index ---------------------------------------

# The admin app precedes this one in INSTALLED_APPS, so a template named
# admin/index.html here would never be found. Unless the project chose its
# own index template, the default site uses one that extends the stock index
# with a link to the dashboard.
if admin.site.index_template is None:
    admin.site.index_template = "admin/leasing/site_index.html"
