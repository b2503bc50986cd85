"""The change list of the leasing tables: exact search, a cheap date hierarchy.

Searches are exact matches on indexed columns, and the date hierarchy of a
large list is derived from the bounds of the index instead of a DISTINCT over
every row.
"""

from __future__ import annotations

import calendar
import datetime
from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.templatetags.admin_list import date_hierarchy
from django.contrib.admin.views.main import ChangeList
from django.db.models import Max, Min, Q, QuerySet
from django.http import HttpRequest
from django.utils import formats, timezone
from django.utils.functional import cached_property
from django.utils.text import capfirst

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


class LeasingChangeList(ChangeList):
    """Django's change list, hardened against out-of-range dates and cheap on large lists."""

    def get_filters(self, request: HttpRequest) -> Any:
        # Django turns some bad date hierarchy values into IncorrectLookupParameters,
        # but `created_at__year=99999999999` (OverflowError) or `=9999` (the year
        # after it is out of range: ValueError) escape as a 500.
        try:
            return super().get_filters(request)
        except (OverflowError, ValueError) as exc:
            raise IncorrectLookupParameters(exc) from exc

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        # The paginator serves the last offered page for a page past it; the
        # page links must mark that page as the current one.
        self.page_num = min(self.page_num, self.paginator.num_pages)

    @cached_property
    def leasing_date_hierarchy(self) -> dict[str, Any] | None:
        """Django's date hierarchy, or one derived from MIN/MAX when the list is large.

        Django's runs `SELECT DISTINCT date_trunc(...)` over the whole result,
        which reads every row of a large list. When the paginator had to
        estimate, the links are generated between the first and last value
        instead (two index lookups); a period may then be empty.
        """
        if not self.date_hierarchy:
            return None
        if not getattr(self.paginator, "is_estimate", False):
            return date_hierarchy(self)
        return bounded_date_hierarchy(self)


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


def bounded_date_hierarchy(cl: ChangeList) -> dict[str, Any]:
    field_name = cl.date_hierarchy
    field = cl.model._meta.get_field(field_name)
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
    table = cl.model._default_manager.using(cl.queryset.db)
    bounds = table.aggregate(first=Min(field_name), last=Max(field_name))
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
