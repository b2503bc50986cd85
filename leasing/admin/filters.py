"""List filters of the work item list: status, lease health, work type, queue.

None of them runs a SELECT DISTINCT over the table: their choices are fixed
or come from `leasing.console.choices`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.http import HttpRequest

from ..conf import read_alias
from ..console.census import STATUSES
from ..console.choices import known_queues, known_work_types
from ..console.leases import LEASE_HEALTH_CHOICES, lease_health_condition
from ..console.retrying import retrying_condition
from ..models import WorkItemQuerySet, WorkItemStatus


class StatusFilter(admin.SimpleListFilter):
    """The four statuses an item can be in (never `expired`, which nothing stores)."""

    title = "status"
    parameter_name = "status__exact"  # the URL Django's own status filter used

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s, WorkItemStatus(s).label) for s in STATUSES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        if value not in STATUSES:
            raise IncorrectLookupParameters(f"Unknown status {value!r}.")
        return queryset.filter(status=value)


class LeaseHealthFilter(admin.SimpleListFilter):
    """Healthy / stale / at risk / expired / no progress, as the dashboard counts them
    (`leasing.console.leases`), via the `in_progress` partial index."""

    title = "lease health"
    parameter_name = "lease_health"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(LEASE_HEALTH_CHOICES)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        assert isinstance(queryset, WorkItemQuerySet)  # a filter of the work items list
        if value not in dict(LEASE_HEALTH_CHOICES):
            raise IncorrectLookupParameters(f"Unknown lease health {value!r}.")
        return queryset.in_progress().filter(lease_health_condition(value, using=queryset.db))


class RetryingFilter(admin.SimpleListFilter):
    """Items failing but still retrying: pending again after failed attempts
    (`leasing.console.retrying`)."""

    title = "retrying"
    parameter_name = "retrying"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Retrying: failed, waiting for another attempt")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        if value != "yes":
            raise IncorrectLookupParameters(f"Unknown retrying value {value!r}.")
        return queryset.filter(retrying_condition())


class KnownValuesFilter(admin.SimpleListFilter):
    """A filter on `column` whose choices come from a cheap call, not SELECT DISTINCT."""

    column = ""
    known: Callable[..., list[str]]

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = list(type(self).known(using=read_alias()))
        current = self.value()
        if current and current not in values:
            values.append(current)
        return [(v, v) for v in sorted(values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return queryset if value is None else queryset.filter(**{self.column: value})


class WorkTypeFilter(KnownValuesFilter):
    title = "work type"
    parameter_name = "work_type"
    column = "work_type"
    known = staticmethod(known_work_types)


class QueueFilter(KnownValuesFilter):
    title = "queue"
    parameter_name = "queue_name"
    column = "queue_name"
    known = staticmethod(known_queues)
