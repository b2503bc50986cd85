"""Work items: the `work_items` table, its statuses and the named filters of its reads."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Self

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Coalesce, Length, Now
from django.db.models.lookups import LessThanOrEqual

from ..conf import get_settings
from ..exceptions import InvalidStatus
from ..ids import new_ulid
from ..states import DependencyFailure, LeaseHealth, UniqueScope, WorkItemStatus
from ..validation import MAX_KEY_LENGTH


def _seconds(value: float | None, default: float) -> timedelta:
    return timedelta(seconds=default if value is None else value)


# The database itself cascades (or nulls) on delete, so purging items with
# one DELETE statement takes their checkpoints along (Django 6.1); Django 6.0
# has no such option, and purging deletes the dependent rows itself.
DB_CASCADE = getattr(models, "DB_CASCADE", models.CASCADE)
DB_SET_NULL = getattr(models, "DB_SET_NULL", models.SET_NULL)


def _claim_keys() -> tuple[Any, ...]:
    """The claim indexes' keys: claim order (`sql.limits.CLAIM_ORDER`), run_after, queue_name."""
    return (
        F("priority").desc(),
        Coalesce("run_after", "created_at"),
        "created_at",
        "work_item_id",
        "run_after",
        "queue_name",
    )


def at_most_key_length(column: str, table: str) -> models.CheckConstraint:
    """CHECK: a text key stays within `MAX_KEY_LENGTH` characters."""
    return models.CheckConstraint(
        condition=LessThanOrEqual(Length(column), MAX_KEY_LENGTH),
        name=f"{table}_{column}_length",
    )


class WorkItemQuerySet(models.QuerySet["WorkItem"]):
    def with_status(self, *statuses: str) -> Self:
        unknown = [s for s in statuses if s not in WorkItemStatus.values]
        if unknown:
            raise InvalidStatus(
                f"Unknown work item status {unknown[0]!r}; "
                f"expected one of {', '.join(WorkItemStatus.values)}."
            )
        return self.filter(status__in=statuses)

    def pending(self) -> Self:
        return self.filter(status=WorkItemStatus.PENDING)

    def in_progress(self) -> Self:
        return self.filter(status=WorkItemStatus.IN_PROGRESS)

    def completed(self) -> Self:
        return self.filter(status=WorkItemStatus.COMPLETED)

    def failed(self) -> Self:
        return self.filter(status=WorkItemStatus.FAILED)

    def finished(self) -> Self:
        return self.filter(
            status__in=[WorkItemStatus.COMPLETED, WorkItemStatus.FAILED, WorkItemStatus.CANCELLED]
        )

    def claimable(self) -> Self:
        """Pending items whose `run_after` has passed and whose dependencies all completed."""
        return (
            self.pending()
            .filter(dependencies_left=0)
            .filter(Q(run_after__isnull=True) | Q(run_after__lte=Now()))
        )

    def blocked(self) -> Self:
        """Pending items waiting for dependencies that have not completed."""
        return self.pending().filter(dependencies_left__gt=0)

    def deferred(self) -> Self:
        """Pending items not claimable before their `run_after`."""
        return self.pending().filter(run_after__gt=Now())

    def expired(self) -> Self:
        """In-progress items whose lease has run out: what the sweep recovers."""
        return self.in_progress().filter(lease_expires_at__lt=Now())

    def live(self) -> Self:
        """In-progress items whose lease is still valid."""
        return self.in_progress().filter(lease_expires_at__gte=Now())

    def stale(self, seconds: float | None = None) -> Self:
        """Live leases whose heartbeat is older than `seconds` (default: `STALE_HEARTBEAT`)."""
        age = _seconds(seconds, get_settings().stale_heartbeat)
        return self.live().filter(heartbeat_at__lt=Now() - age)

    def healthy(self, seconds: float | None = None) -> Self:
        """Live leases with a recent heartbeat."""
        age = _seconds(seconds, get_settings().stale_heartbeat)
        return self.live().filter(heartbeat_at__gte=Now() - age)

    def with_lease_health(self, health: str, seconds: float | None = None) -> Self:
        if health == LeaseHealth.HEALTHY:
            return self.healthy(seconds)
        if health == LeaseHealth.STALE:
            return self.stale(seconds)
        if health == LeaseHealth.EXPIRED:
            return self.expired()
        raise InvalidStatus(
            f"Unknown lease health {health!r}; expected one of {', '.join(LeaseHealth.values)}."
        )

    def without_progress(self, seconds: float | None = None) -> Self:
        """Live leases whose heartbeat is fresh but whose handler shows no progress.

        The lease is being renewed (a `thread`-mode heartbeat keeps it alive),
        yet the handler has not beaten for `seconds` (default: `STALE_HEARTBEAT`)
        since its last beat, or since the claim if it never beat: likely stuck.
        """
        age = _seconds(seconds, get_settings().stale_heartbeat)
        cutoff = Now() - age
        return self.healthy(seconds).filter(
            Q(progress_at__lt=cutoff) | Q(progress_at__isnull=True, lease_acquired_at__lt=cutoff)
        )

    def held_by(self, worker_id: str) -> Self:
        return self.in_progress().filter(lease_holder=worker_id)

    def for_task(self, task_id: str) -> Self:
        return self.filter(task_id=task_id)

    def of_type(self, *work_types: str) -> Self:
        return self.filter(work_type__in=work_types)

    def claim_order(self) -> Self:
        return self.order_by(F("priority").desc(), "created_at", "work_item_id")


class WorkItem(models.Model):
    Status = WorkItemStatus

    work_item_id = models.TextField(primary_key=True, default=new_ulid, editable=False)
    task_id = models.TextField()
    work_type = models.TextField()
    status = models.TextField(
        choices=WorkItemStatus.choices,
        default=WorkItemStatus.PENDING,
        db_default=WorkItemStatus.PENDING,
    )
    priority = models.IntegerField(default=0, db_default=0, help_text="Higher runs first.")
    lease_holder = models.TextField(null=True, blank=True)
    lease_token = models.BigIntegerField(
        default=0, db_default=0, help_text="Fencing token: +1 on every claim."
    )
    lease_acquired_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_deadline_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The most the lease can live: claim time + timeout or MAX_LEASE_LIFETIME.",
    )
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True)
    # A request, not a status: the item still runs and holds its lease until its
    # run ends, which then ends it `cancelled` (leasing.transitions).
    cancel_requested_at = models.DateTimeField(
        "asked to stop at",
        null=True,
        blank=True,
        help_text="Someone cancelled this item while it ran: its handler is told within one "
        "heartbeat interval, and its run ends cancelled.",
    )
    retry_count = models.IntegerField(default=0, db_default=0)
    max_retries = models.IntegerField(default=3, db_default=3)
    interruptions = models.IntegerField(
        default=0,
        db_default=0,
        help_text="Attempts in a row cut short by the database (not counted as retries).",
    )
    run_after = models.DateTimeField(null=True, blank=True)
    queue_name = models.TextField(default="default", db_default="default")
    input_data = models.JSONField(null=True, blank=True)
    output_data = models.JSONField(null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())
    unique_key = models.TextField(
        null=True, blank=True, help_text="Enqueue returns the holder of this key instead."
    )
    unique_scope = models.TextField(null=True, blank=True, choices=UniqueScope.choices)
    unique_until = models.DateTimeField(
        null=True, blank=True, help_text="The end of the key's period (period scope only)."
    )
    dependencies_left = models.IntegerField(
        default=0,
        db_default=0,
        help_text="Dependencies not completed yet; claimable only at 0.",
    )
    has_dependents = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Some item depends on this one (its completion or failure must reach them).",
    )
    on_dependency_failure = models.TextField(
        null=True, blank=True, choices=DependencyFailure.choices
    )
    # The W3C trace context (traceparent, tracestate) of the code that enqueued the item,
    # when LEASING["TRACING"] is on (leasing.tracing): its run's span continues that trace.
    trace_context = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text="The enqueuer's W3C trace context, when tracing was on.",
    )
    rate_key = models.TextField(
        null=True,
        blank=True,
        help_text="Claims of items with this key are held to its rate limit (LEASING RATE_LIMITS "
        "'key:...' or the enqueue's rate_limit).",
    )
    fairness_key = models.TextField(
        null=True,
        blank=True,
        help_text="The tenant: in a fair queue, claims take turns across these keys.",
    )

    # Not a column: `enqueue()` and `enqueue_many()` set it to True on an
    # existing item they return because it holds the unique key asked for.
    duplicate: bool = False

    objects = WorkItemQuerySet.as_manager()

    class Meta:
        db_table = "work_items"
        ordering = ["-created_at"]
        get_latest_by = "created_at"
        permissions = [
            (
                "force_release_workitem",
                "Can force-release, force-fail, retry, cancel, delete and run now work items",
            ),
            ("view_payload", "Can view work item and checkpoint payloads"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=WorkItemStatus.values), name="work_items_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status=WorkItemStatus.IN_PROGRESS)
                | Q(
                    lease_holder__isnull=False,
                    lease_expires_at__isnull=False,
                    lease_deadline_at__isnull=False,
                ),
                name="work_items_in_progress_has_lease",
            ),
            models.CheckConstraint(
                condition=Q(lease_token__gte=0), name="work_items_lease_token_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(retry_count__gte=0, max_retries__gte=0, interruptions__gte=0),
                name="work_items_counts_non_negative",
            ),
            *(
                at_most_key_length(column, "work_items")
                for column in ("task_id", "work_type", "queue_name", "lease_holder", "unique_key")
            ),
            # A key has a scope, and only the period scope has an end.
            models.CheckConstraint(
                condition=Q(
                    unique_key__isnull=True, unique_scope__isnull=True, unique_until__isnull=True
                )
                | Q(
                    unique_key__isnull=False,
                    unique_scope__in=[UniqueScope.PENDING, UniqueScope.UNFINISHED],
                    unique_until__isnull=True,
                )
                | Q(
                    unique_key__isnull=False,
                    unique_scope=UniqueScope.PERIOD,
                    unique_until__isnull=False,
                ),
                name="work_items_unique_scope_valid",
            ),
            # While an item holds its key (by its scope's status condition), no
            # other item with that key and scope can be inserted: enqueue's
            # INSERT ... ON CONFLICT names this index, with the same predicate
            # (`sql.unique.HOLDING`; SQLite compares the two term by term).
            models.UniqueConstraint(
                fields=["unique_key", "unique_scope"],
                condition=(Q(unique_scope=UniqueScope.PENDING) & Q(status=WorkItemStatus.PENDING))
                | (
                    Q(unique_scope=UniqueScope.UNFINISHED)
                    & Q(status__in=[WorkItemStatus.PENDING, WorkItemStatus.IN_PROGRESS])
                ),
                name="work_items_unique_key_uniq",
            ),
            models.CheckConstraint(
                condition=Q(dependencies_left__gte=0),
                name="work_items_dependencies_left_non_negative",
            ),
            models.CheckConstraint(
                condition=Q(on_dependency_failure__isnull=True)
                | Q(on_dependency_failure__in=DependencyFailure.values),
                name="work_items_on_dependency_failure_valid",
            ),
        ]
        indexes = [
            models.Index(
                fields=["task_id", "status", "-created_at"], name="work_items_task_status_idx"
            ),
            # Claim order (sql.work_items.CLAIM_ORDER): priority, the time the
            # item became available, enqueue order; the id breaks ties between
            # rows of one bulk INSERT. A claim stops at the first row not yet
            # available. Items blocked by dependencies are not in it at all, so
            # a claim never walks past them however many there are.
            # run_after, queue_name and work_type ride along (they never change
            # the order: the id is unique). A claim filtered to some queues or
            # work types checks the range of them on the index entry, so items
            # of the others are skipped without reading the table
            # (`sql.candidates._range`), and the console's backlog and
            # queue table are index-only scans of this and the next index.
            models.Index(
                *_claim_keys(),
                "work_type",
                name="work_items_claim_idx",
                condition=Q(status=WorkItemStatus.PENDING, dependencies_left=0),
            ),
            # The claim index led by the work type: a claim filtered to work
            # types may read each type's items in claim order on its own
            # (`sql.candidates`), never walking other types' backlogs.
            models.Index(
                "work_type",
                *_claim_keys(),
                name="work_items_claim_type_idx",
                condition=Q(status=WorkItemStatus.PENDING, dependencies_left=0),
            ),
            # Pending items blocked by dependencies (counted by the console;
            # never a claim candidate: its condition excludes dependencies_left = 0).
            models.Index(
                fields=["created_at", "queue_name", "work_type", "run_after"],
                name="work_items_blocked_idx",
                condition=Q(status=WorkItemStatus.PENDING, dependencies_left__gt=0),
            ),
            # The holders of a period-scoped unique key.
            models.Index(
                fields=["unique_key", "unique_until"],
                name="work_items_unique_period_idx",
                condition=Q(unique_scope=UniqueScope.PERIOD),
            ),
            models.Index(
                fields=["lease_expires_at"],
                name="work_items_lease_expiry_idx",
                condition=Q(status=WorkItemStatus.IN_PROGRESS),
            ),
            # In-flight items by queue and work type: the claim counts them
            # against LEASING["QUEUE_LIMITS"] / ["WORK_TYPE_LIMITS"] (only the
            # in-flight rows are in it, so a count reads a handful of entries).
            # The holder rides along: a worker's leases are found among these
            # entries, so a claim writes one index for both (migration 0019).
            models.Index(
                fields=["queue_name", "work_type", "lease_holder"],
                name="work_items_in_flight_idx",
                condition=Q(status=WorkItemStatus.IN_PROGRESS),
            ),
            # The console. The admin lists items newest
            # first (its tie-breaker is the primary key) and bounds its date
            # hierarchy with MIN/MAX(created_at).
            # The console's count of the items waiting on a rate key (`leasing.console.rates`).
            models.Index(
                fields=["rate_key"],
                name="work_items_rate_key_idx",
                condition=Q(status=WorkItemStatus.PENDING, rate_key__isnull=False),
            ),
            # A fair queue's claim (`leasing.sql.fairness`): each key's pending items in
            # claim order (the items without a key too), and the skip scan from one key
            # to the next.
            models.Index(
                "queue_name",
                "fairness_key",
                F("priority").desc(),
                Coalesce("run_after", "created_at"),
                "created_at",
                "work_item_id",
                "run_after",
                name="work_items_fair_idx",
                condition=Q(status=WorkItemStatus.PENDING, dependencies_left=0),
            ),
            models.Index(fields=["-created_at", "-work_item_id"], name="work_items_created_idx"),
            # Throughput over time, and the queue table's finished counts and run
            # times of a window: finished items by completion time, index-only.
            # (retry_count: the dashboard's retry distribution of the window.)
            models.Index(
                fields=[
                    "completed_at",
                    "status",
                    "queue_name",
                    "work_type",
                    "lease_acquired_at",
                    "retry_count",
                ],
                name="work_items_finished_idx",
                condition=Q(completed_at__isnull=False),
            ),
            # Items by status, the retry distribution and the claims
            # counter (SUM(lease_token)) in one index-only scan. Deliberately
            # not led by status: an index that can answer `status = 'pending'`
            # competes with the claim index, and with stale statistics (just
            # after a burst of enqueues) the planner picked it and sorted every
            # pending row on each claim. In-flight rows are left out, so a
            # claim does not write it; the census counts them through
            # `work_items_in_flight_idx` (`console.census`).
            models.Index(
                fields=["retry_count", "status", "lease_token"],
                name="work_items_status_retry_idx",
                condition=~Q(status=WorkItemStatus.IN_PROGRESS),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.work_type} {self.work_item_id} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            # Database clock, refreshed through RETURNING.
            self.updated_at = Now()
            update_fields = kwargs.get("update_fields")
            if update_fields is not None:
                kwargs["update_fields"] = {*update_fields, "updated_at"}
        super().save(*args, **kwargs)
