"""The change list of the leasing tables: exact search, a cheap date hierarchy.

Searches are exact matches on indexed columns, and the date hierarchy is
derived from two bounds read cheaply instead of a MIN/MAX and a DISTINCT over
every filtered row.
"""

from __future__ import annotations

import calendar
import datetime
from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import EmptyResultSet, ValidationError
from django.db.models import Field, Max, Min, Q, QuerySet
from django.http import HttpRequest
from django.utils import formats, timezone
from django.utils.functional import cached_property
from django.utils.text import capfirst

from . import payload_search

SEARCH_TERMS_LIMIT = 50


def exact_search(
    queryset: QuerySet[Any], search_term: str, columns: tuple[str, ...], upper: tuple[str, ...] = ()
) -> QuerySet[Any]:
    """Exact matches of any whitespace-separated term on any of `columns`.

    Django's default search (`icontains`) cannot use an index and would read
    every row; exact matches use the primary key and the indexes on task and
    holder. `upper` columns also match the upper-cased term (ULIDs are
    upper-case; pasted ids are not always).
    """
    terms = [t for t in search_term.replace(",", " ").split() if t][:SEARCH_TERMS_LIMIT]
    if not terms:
        return queryset
    condition = Q()
    for column in columns:
        values = set(terms)
        if column in upper:
            values |= {t.upper() for t in terms}
        condition |= Q(**{f"{column}__in": sorted(values)})
    return queryset.filter(condition)


# What a lookup value the database layer cannot turn into SQL raises.
BAD_VALUE_ERRORS = (OverflowError, ValueError, ValidationError)


class CheckedChangeList(ChangeList):
    """Django's change list, answering every lookup value it cannot query with as an
    invalid lookup (a redirect to `?e=1`), never a 500.

    Django turns the errors of `filter()` into `IncorrectLookupParameters`, but
    some values are only checked when the query is compiled, after the list was
    built: `?run_after__year=0` (no year 0) raised a ValueError while the page
    counted its rows. So the list's query is compiled here, where Django still
    answers such an error as a bad lookup (no database round trip).
    """

    def get_filters(self, request: HttpRequest) -> Any:
        # Django turns some bad date hierarchy values into IncorrectLookupParameters,
        # but `created_at__year=99999999999` (OverflowError) or `=9999` (the year
        # after it is out of range: ValueError) escape as a 500.
        try:
            return super().get_filters(request)
        except BAD_VALUE_ERRORS as exc:
            raise IncorrectLookupParameters(exc) from exc

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> Any:
        queryset = self.narrowed(request, super().get_queryset(request, exclude_parameters))
        try:
            queryset.query.get_compiler(using=queryset.db).as_sql()
        except EmptyResultSet:
            pass  # a list that matches nothing (`pk__in=[]`): valid, and empty
        except BAD_VALUE_ERRORS as exc:
            raise IncorrectLookupParameters(exc) from exc
        return queryset

    def narrowed(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The list's rows after Django's filters; a subclass narrows them further."""
        return queryset


class CheckedLookups:
    """The change list of a ModelAdmin whose query string must never be a 500: mix in
    before `admin.ModelAdmin` (every leasing list has it, through `ReadOnlyAdmin`)."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return CheckedChangeList


class LeasingChangeList(CheckedChangeList):
    """The change list of the leasing tables: bad lookup values refused (see
    `CheckedChangeList`), cheap on large lists.

    On a list whose admin sets `payload_search`, the payload filters
    (`leasing.admin.payload_search`) are no column lookups: they are left out
    of Django's filters and applied here, when the admin allowed them
    (`request.leasing_payload_filters`).
    """

    def get_filters_params(self, params: Any = None) -> Any:
        lookup_params = super().get_filters_params(params)
        if getattr(self.model_admin, "payload_search", False):
            for name in [n for n in lookup_params if payload_search.is_payload_param(n)]:
                del lookup_params[name]
        return lookup_params

    def narrowed(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        filters = getattr(request, "leasing_payload_filters", None)
        return payload_search.apply(queryset, filters) if filters else queryset

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        # The paginator serves the last offered page for a page past it; the
        # page links must mark that page as the current one.
        self.page_num = min(self.page_num, self.paginator.num_pages)

    @cached_property
    def leasing_date_hierarchy(self) -> dict[str, Any] | None:
        """A date hierarchy whose bounds cost at most a bounded read.

        Django's runs `MIN/MAX(created_at)` over the filtered rows, then a
        `SELECT DISTINCT date_trunc(...)`: on a table of millions of rows the
        MIN alone walks the created_at index past every row the filter rejects
        (`WHERE status = 'in_progress'` reads the whole finished history first).
        Here the links are generated between two bounds: when the paginator
        counted the list exactly (at most `exact_limit` rows), the bounds of
        those rows, read through the filter's own index with a LIMIT; when it
        had to estimate, the first and last value of the whole table (two
        lookups at the ends of its index), so a period may then hold none of
        the filtered rows.
        """
        if not self.date_hierarchy:
            return None
        field = self.date_hierarchy
        limit = getattr(self.paginator, "exact_limit", None)
        if getattr(self.paginator, "is_estimate", False):
            rows = self.model._default_manager.using(self.queryset.db).order_by()
        elif limit is not None and self.result_count <= limit:
            rows = self.queryset.order_by().values(field)[: limit + 1]
        else:  # SQLite counts every list exactly, however long
            rows = self.queryset.order_by()
        bounds = rows.aggregate(first=Min(field), last=Max(field))
        return bounded_date_hierarchy(self, bounds["first"], bounds["last"])


def _lookup(params: dict[str, Any], name: str, highest: int) -> int | None:
    """A year, month or day from the query string; None when absent or out of range."""
    value = params.get(name)
    if isinstance(value, list):
        value = value[-1] if value else None
    try:
        number = int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return number if number is not None and 1 <= number <= highest else None


def _title(date: datetime.date, format_name: str) -> str:
    return capfirst(formats.date_format(date, format_name))


def bounded_date_hierarchy(
    cl: ChangeList, first_value: datetime.datetime | None, last_value: datetime.datetime | None
) -> dict[str, Any]:
    """The date hierarchy's links (Django's template context) between two bounds."""
    field_name = cl.date_hierarchy
    field = cl.model._meta.get_field(field_name)
    assert isinstance(field, Field)  # a date column, never a relation's reverse side
    year_field, month_field, day_field = (f"{field_name}__{p}" for p in ("year", "month", "day"))
    year = _lookup(cl.params, year_field, 9998)
    month = _lookup(cl.params, month_field, 12)
    day = _lookup(cl.params, day_field, 31)

    def link(filters: dict[str, Any]) -> str:
        return cl.get_query_string(filters, [f"{field_name}__"])

    result: dict[str, Any] = {"show": True, "field_name": field.verbose_name, "back": None}
    if year and month and day:
        date = datetime.date(year, month, day)
        result["back"] = {
            "link": link({year_field: year, month_field: month}),
            "title": _title(date, "YEAR_MONTH_FORMAT"),
        }
        result["choices"] = [{"title": _title(date, "MONTH_DAY_FORMAT")}]
        return result
    if not first_value or not last_value:
        return {"show": False}
    first = timezone.localtime(first_value).date()
    last = timezone.localtime(last_value).date()
    if not year and first.year == last.year:
        year = first.year
        if first.month == last.month:
            month = first.month
    if year and month:
        days = range(1, calendar.monthrange(year, month)[1] + 1)
        result["back"] = {"link": link({year_field: year}), "title": str(year)}
        result["choices"] = [
            {
                "link": link({year_field: year, month_field: month, day_field: d.day}),
                "title": _title(d, "MONTH_DAY_FORMAT"),
            }
            for d in (datetime.date(year, month, n) for n in days)
            if first <= d <= last
        ]
    elif year:
        result["back"] = {"link": link({}), "title": "All dates"}
        result["choices"] = [
            {
                "link": link({year_field: year, month_field: m}),
                "title": _title(datetime.date(year, m, 1), "YEAR_MONTH_FORMAT"),
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
