"""The base of every leasing ModelAdmin: read-only, large-table lists, refusal of bad input."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG
from django.core.exceptions import FieldDoesNotExist
from django.db.models import ForeignObjectRel, JSONField, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.db.models.fields.related import RelatedField
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, reverse
from django.utils.safestring import SafeString

from ..conf import read_alias
from . import display
from .changelist import LeasingChangeList, exact_search
from .guards import first_unstorable, refusal_message, storable
from .paginator import EstimatedCountPaginator
from .views.unreachable import answering_when_unreachable

if TYPE_CHECKING:
    # django-stubs' name for what get_fields returns: names, or groups of names on a line.
    from django.contrib.admin.options import _FieldGroups

    from ..models import Checkpoint, IdempotencyKey

    _ModelAdmin = admin.ModelAdmin[Any]
else:  # Django's ModelAdmin is not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin

# What a list's query string may ask of a column: what its filters, links and the
# date hierarchy use, and plain comparisons. Django allows any lookup on a local
# column: `?task_id__regex=(` was a database error (a 500), `?input_data__card=…`
# probed payloads a user may not see, and `?x__contains=` scanned every row.
ALLOWED_LOOKUPS = frozenset(
    {"exact", "iexact", "in", "isnull", "gt", "gte", "lt", "lte", "range", "year", "month", "day"}
)


class ReadOnlyAdmin(_ModelAdmin):
    """Rows written only by the services: viewable, never added, changed or deleted here.

    Every view first refuses parameters the database cannot store, with a
    message instead of a database error; a database that does not answer
    (`LEASING["READ_DATABASE"]` or the primary) makes any of its pages a 503
    page saying which and why, never a 500 (`views.unreachable`).
    """

    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    # Exact matches on indexed columns only (see `get_search_results`).
    search_columns: tuple[str, ...] = ()
    search_upper: tuple[str, ...] = ()
    # The detail page: `detail_fields`, then `payload_fields` for `leasing.view_payload`.
    detail_fields: tuple[str, ...] = ()
    payload_fields: tuple[str, ...] = ()

    class Media:
        css = {"all": ["leasing/admin.css"]}

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # rows are written by the services (enqueue, workers, the sweep)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # state changes only through the operator actions

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # deleting an item would cascade to its audit trail

    def console_urls(self) -> list[URLPattern]:
        """The admin's pages besides Django's list, item and history pages."""
        return []

    def get_urls(self) -> list[URLPattern]:
        urls = [*self.console_urls(), *super().get_urls()]
        return answering_when_unreachable(urls, self.admin_site)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # Lists and item pages display rows: they read from LEASING["READ_DATABASE"]
        # (a replica, when set). An operator action re-reads on the primary.
        return super().get_queryset(request).using(read_alias())

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[LeasingChangeList]:
        return LeasingChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        if not self.search_columns:
            return super().get_search_results(request, queryset, search_term)
        return exact_search(queryset, search_term, self.search_columns, self.search_upper), False

    def get_fields(self, request: HttpRequest, obj: Any = None) -> _FieldGroups:
        if not self.detail_fields:
            return super().get_fields(request, obj)
        return list(self._detail_fields(request))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if not self.detail_fields:
            return list(super().get_readonly_fields(request, obj))
        return self._detail_fields(request)

    def _detail_fields(self, request: HttpRequest) -> list[str]:
        fields = list(self.detail_fields)
        if self.payload_fields and display.payloads_visible(request.user):
            fields += self.payload_fields
        return fields

    # --- bad input: a message, never a database error ---

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        """Comparisons on columns only; never a lookup inside a JSON payload (a 400 instead)."""
        name, *rest = lookup.split(LOOKUP_SEP)
        try:
            field = self.opts.get_field(name)
        except FieldDoesNotExist:  # a custom filter's parameter, or ignored
            return super().lookup_allowed(lookup, value, request)
        if isinstance(field, JSONField):
            return False
        allowed = ALLOWED_LOOKUPS
        if isinstance(field, RelatedField | ForeignObjectRel) and field.target_field is not None:
            allowed = allowed | {field.target_field.name}  # `work_item__work_item_id`
        if any(part not in allowed for part in rest):
            return False
        if rest and rest[-1] == "range" and len([v for v in str(value).split(",") if v]) != 2:
            # Django checks a range's two ends only when it compiles the query (a 500).
            raise IncorrectLookupParameters(f"{lookup} takes two values: from,to.")
        return super().lookup_allowed(lookup, value, request)

    def _refuse_unstorable(self, request: HttpRequest) -> HttpResponse | None:
        name = first_unstorable(request.GET, request.POST)
        if name is None:
            return None
        self.message_user(request, refusal_message(f"parameter {name}"), messages.ERROR)
        info = self.opts.app_label, self.opts.model_name
        url = reverse("{}:{}_{}_changelist".format(self.admin_site.name, *info))
        return HttpResponseRedirect(url)

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        # None makes Django answer "doesn't exist" instead of querying with a NUL.
        if not storable(object_id):
            return None
        # Django passes `?_to_field=` (empty) on as the field '' (FieldDoesNotExist: a 500);
        # empty means the primary key, as when the parameter is absent.
        return super().get_object(request, object_id, from_field or None)

    def get_changelist_instance(self, request: HttpRequest) -> LeasingChangeList:
        try:
            changelist = super().get_changelist_instance(request)
        except IncorrectLookupParameters:
            if ERROR_FLAG not in request.GET:
                self.message_user(
                    request,
                    "The filter, sort or date parameters of the list were not valid; "
                    "the whole list is shown instead.",
                    messages.ERROR,
                )
            raise
        assert isinstance(changelist, LeasingChangeList)  # get_changelist() names it
        return changelist

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        return self._refuse_unstorable(request) or super().changelist_view(request, extra_context)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: Any = None,
    ) -> HttpResponse:
        return self._refuse_unstorable(request) or super().changeform_view(
            request, object_id, form_url, extra_context
        )

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        return self._refuse_unstorable(request) or super().history_view(
            request, object_id, extra_context
        )

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        return self._refuse_unstorable(request) or super().delete_view(
            request, object_id, extra_context
        )


class WorkItemLinkColumn:
    """The `work_item_link` column of tables that reference a work item."""

    admin_site: admin.AdminSite

    @admin.display(description="work item")
    def work_item_link(self, obj: Checkpoint | IdempotencyKey) -> SafeString | str:
        return display.work_item_link(self.admin_site.name, obj.work_item_id)
