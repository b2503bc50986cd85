"""A paginator that does not COUNT(*) millions of rows on every list page, nor offer pages
it cannot serve quickly."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

from ..storage import storage_for

if TYPE_CHECKING:
    _Paginator = Paginator[Any]
else:  # Django's Paginator is not subscriptable at run time
    _Paginator = Paginator


class EstimatedCountPaginator(_Paginator):
    """Counts exactly up to `exact_limit` rows, then asks the planner.

    The exact count is `SELECT COUNT(*) FROM (... LIMIT n + 1)`, cheap whatever
    the table size; beyond it, on PostgreSQL, the row estimate of the planner
    (`EXPLAIN`) is within a few percent after ANALYZE, and the count is marked
    as an estimate so the page says "about". SQLite counts exactly.
    """

    exact_limit = 10_000
    # A page is `OFFSET (n - 1) * per_page`, which PostgreSQL serves by reading
    # and discarding every row before it: page 20,000 of a million rows takes a
    # second. Pages past `max_pages` are not offered; a request for one gets the
    # last offered page, and the list says how to reach the rest (filters, the
    # date hierarchy, or the other sort direction).
    max_pages = 200
    is_estimate = False  # set by `count` when it had to estimate

    @cached_property
    def num_pages(self) -> int:
        return min(super().num_pages, self.max_pages)

    @property
    def is_capped(self) -> bool:
        """Whether the list has rows past the last offered page."""
        return self.count > self.max_pages * self.per_page

    def validate_number(self, number: Any) -> int:
        # A page past the last offered one is clamped instead of raising
        # EmptyPage: Django turns that into a redirect to `?e=1`, which drops
        # the operator's filters.
        if isinstance(number, int) and number > self.num_pages:
            number = self.num_pages
        return super().validate_number(number)

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        storage = storage_for(queryset.db)
        if not storage.estimates_rows:
            return queryset.count()
        capped = queryset.order_by().values("pk")[: self.exact_limit + 1].count()
        if capped <= self.exact_limit:
            return capped
        self.is_estimate = True
        return max(self.exact_limit + 1, storage.estimated_rows(queryset))
