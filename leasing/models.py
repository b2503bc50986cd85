"""The four tables of SPEC §3, declared as models.

Table and column names match the spec exactly so that the monitoring SQL of
SPEC §13 runs unchanged. State changes do not live here: they are conditional
UPDATEs in the service modules (`lease`, `recovery`, `operations`, ...). The
querysets hold the named filters the services, admin and dashboard share.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Self

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now

from .exceptions import CheckpointImmutable, InvalidCheckpointType, InvalidStatus
from .ids import new_ulid


def _seconds(value: float | None, default: float) -> timedelta:
    return timedelta(seconds=default if value is None else value)


# --- work items -------------------------------------------------------------------------


class WorkItemStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    IN_PROGRESS = "in_progress", "In progress"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"


class LeaseHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    STALE = "stale", "Stale heartbeat"
    EXPIRED = "expired", "Expired, awaiting sweep"


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
        return self.filter(status__in=[WorkItemStatus.COMPLETED, WorkItemStatus.FAILED])

    def claimable(self) -> Self:
        """Pending items whose `run_after` has passed (by the database clock)."""
        return self.pending().filter(Q(run_after__isnull=True) | Q(run_after__lte=Now()))

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
        from .conf import get_settings

        age = _seconds(seconds, get_settings().stale_heartbeat)
        return self.live().filter(heartbeat_at__lt=Now() - age)

    def healthy(self, seconds: float | None = None) -> Self:
        """Live leases with a recent heartbeat."""
        from .conf import get_settings

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
        from .conf import get_settings

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

    def in_queue(self, *queue_names: str) -> Self:
        return self.filter(queue_name__in=queue_names)

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
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True)
    retry_count = models.IntegerField(default=0, db_default=0)
    max_retries = models.IntegerField(default=3, db_default=3)
    run_after = models.DateTimeField(null=True, blank=True)
    queue_name = models.TextField(default="default", db_default="default")
    input_data = models.JSONField(null=True, blank=True)
    output_data = models.JSONField(null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    objects = WorkItemQuerySet.as_manager()

    class Meta:
        db_table = "work_items"
        ordering = ["-created_at"]
        get_latest_by = "created_at"
        permissions = [
            ("force_release_workitem", "Can force-release, force-fail and retry work items"),
            ("view_payload", "Can view work item and checkpoint payloads"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=WorkItemStatus.values), name="work_items_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status=WorkItemStatus.IN_PROGRESS)
                | Q(lease_holder__isnull=False, lease_expires_at__isnull=False),
                name="work_items_in_progress_has_lease",
            ),
            models.CheckConstraint(
                condition=Q(lease_token__gte=0), name="work_items_lease_token_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(retry_count__gte=0, max_retries__gte=0),
                name="work_items_retries_non_negative",
            ),
        ]
        indexes = [
            models.Index(
                fields=["task_id", "status", "-created_at"], name="work_items_task_status_idx"
            ),
            # Claim order; the id breaks ties between rows of one bulk INSERT.
            # run_after rides along (it never changes the order: the id is
            # unique) so the backlog figures are index-only scans of this index,
            # and no second partial index on pending rows competes with it in
            # the claim's plan.
            models.Index(
                fields=["-priority", "created_at", "work_item_id", "run_after"],
                name="work_items_claim_idx",
                condition=Q(status=WorkItemStatus.PENDING),
            ),
            models.Index(
                fields=["lease_expires_at"],
                name="work_items_lease_expiry_idx",
                condition=Q(status=WorkItemStatus.IN_PROGRESS),
            ),
            models.Index(
                fields=["lease_holder", "status"],
                name="work_items_holder_idx",
                condition=Q(lease_holder__isnull=False),
            ),
            # Admin dashboard (issue 5, SPEC §15). The admin lists items newest
            # first (its tie-breaker is the primary key) and bounds its date
            # hierarchy with MIN/MAX(created_at).
            models.Index(fields=["-created_at", "-work_item_id"], name="work_items_created_idx"),
            # Throughput over time, and the queue table's finished counts and run
            # times in a window: finished items by completion time, index-only.
            models.Index(
                fields=["completed_at", "status", "queue_name", "work_type", "lease_acquired_at"],
                name="work_items_finished_idx",
                condition=Q(completed_at__isnull=False),
            ),
            # The queue table's pending counts per queue and work type, index-only.
            models.Index(
                fields=["queue_name", "work_type", "created_at", "run_after"],
                name="work_items_pending_queue_idx",
                condition=Q(status=WorkItemStatus.PENDING),
            ),
            # Items by status, the retry distribution (SPEC §13) and the claims
            # counter (SUM(lease_token)) in one index-only scan. Deliberately
            # not led by status: an index that can answer `status = 'pending'`
            # competes with the claim index, and with stale statistics (just
            # after a burst of enqueues) the planner picked it and sorted every
            # pending row on each claim.
            models.Index(
                fields=["retry_count", "status", "lease_token"],
                name="work_items_status_retry_idx",
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

    @property
    def is_finished(self) -> bool:
        return self.status in (WorkItemStatus.COMPLETED, WorkItemStatus.FAILED)


# --- checkpoints ------------------------------------------------------------------------


class CheckpointType(models.TextChoices):
    ITERATION_START = "iteration_start", "Iteration start"
    ITERATION_END = "iteration_end", "Iteration end"
    TOOL_EXECUTED = "tool_executed", "Tool executed"
    LLM_RESPONSE = "llm_response", "LLM response"
    APPROVAL_POINT = "approval_point", "Approval point"
    STATE_TRANSITION = "state_transition", "State transition"
    MANUAL_CHECKPOINT = "manual_checkpoint", "Manual checkpoint"
    ERROR_BOUNDARY = "error_boundary", "Error boundary"

    @classmethod
    def validate(cls, value: Any) -> str:
        if value not in cls.values:
            raise InvalidCheckpointType(
                f"Unknown checkpoint type {value!r}; expected one of {', '.join(cls.values)}."
            )
        return str(value)


class CheckpointQuerySet(models.QuerySet["Checkpoint"]):
    def for_task(self, task_id: str) -> Self:
        return self.filter(task_id=task_id).order_by("sequence_number")

    def of_type(self, checkpoint_type: str) -> Self:
        return self.filter(checkpoint_type=CheckpointType.validate(checkpoint_type))

    def update(self, **kwargs: Any) -> int:
        raise CheckpointImmutable("Checkpoints are append-only and cannot be updated.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise CheckpointImmutable(
            "Checkpoints are deleted only by retention cleanup "
            "(leasing.checkpoints.cleanup_checkpoints)."
        )


class Checkpoint(models.Model):
    Type = CheckpointType

    checkpoint_id = models.TextField(primary_key=True, default=new_ulid, editable=False)
    task_id = models.TextField()
    work_item = models.ForeignKey(
        WorkItem,
        null=True,
        blank=True,
        on_delete=models.DB_CASCADE,
        db_column="work_item_id",
        db_index=False,  # covered by checkpoints_item_seq_idx
        related_name="checkpoints",
    )
    checkpoint_type = models.TextField(choices=CheckpointType.choices)
    sequence_number = models.BigIntegerField()
    snapshot_data = models.JSONField()
    metadata = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        db_table = "checkpoints"
        ordering = ["task_id", "sequence_number"]
        constraints = [
            models.UniqueConstraint(
                fields=["task_id", "sequence_number"], name="checkpoints_task_seq_uniq"
            ),
            models.CheckConstraint(
                condition=Q(checkpoint_type__in=CheckpointType.values),
                name="checkpoints_type_valid",
            ),
            models.CheckConstraint(
                condition=Q(sequence_number__gte=1), name="checkpoints_sequence_positive"
            ),
        ]
        indexes = [
            # (task_id, sequence_number) is served by checkpoints_task_seq_uniq.
            models.Index(
                fields=["work_item", "sequence_number"],
                name="checkpoints_item_seq_idx",
                condition=Q(work_item__isnull=False),
            ),
            models.Index(fields=["checkpoint_type", "-created_at"], name="checkpoints_type_idx"),
            models.Index(fields=["-created_at"], name="checkpoints_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} #{self.sequence_number} {self.checkpoint_type}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise CheckpointImmutable("Checkpoints are append-only and cannot be updated.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise CheckpointImmutable("Checkpoints are deleted only by retention cleanup.")


# --- idempotency keys ---------------------------------------------------------------------


class IdempotencyStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"


class IdempotencyKeyQuerySet(models.QuerySet["IdempotencyKey"]):
    def expired(self) -> Self:
        return self.filter(expires_at__isnull=False, expires_at__lte=Now())

    def live(self) -> Self:
        return self.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=Now()))


class IdempotencyKey(models.Model):
    Status = IdempotencyStatus

    idempotency_key = models.CharField(max_length=255, primary_key=True)
    task_id = models.TextField(null=True, blank=True)
    work_item = models.ForeignKey(
        WorkItem,
        null=True,
        blank=True,
        on_delete=models.DB_SET_NULL,
        db_column="work_item_id",
        related_name="idempotency_keys",
    )
    request_hash = models.TextField()
    response_data = models.JSONField(null=True, blank=True)
    status = models.TextField(
        choices=IdempotencyStatus.choices,
        default=IdempotencyStatus.PENDING,
        db_default=IdempotencyStatus.PENDING,
    )
    created_at = models.DateTimeField(db_default=Now())
    completed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    objects = IdempotencyKeyQuerySet.as_manager()

    class Meta:
        db_table = "idempotency_keys"
        ordering = ["-created_at"]
        verbose_name = "idempotency key"
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=IdempotencyStatus.values),
                name="idempotency_status_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["task_id"], name="idempotency_task_idx"),
            models.Index(
                fields=["expires_at"],
                name="idempotency_expires_idx",
                condition=Q(expires_at__isnull=False),
            ),
            models.Index(fields=["status", "-created_at"], name="idempotency_status_idx"),
        ]

    def __str__(self) -> str:
        return self.idempotency_key


# --- worker registry ------------------------------------------------------------------------


class WorkerRole(models.TextChoices):
    WORKER = "worker", "Worker"
    SWEEPER = "sweeper", "Recovery sweep"


class WorkerStatus(models.TextChoices):
    RUNNING = "running", "Running"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    LOST = "lost", "Lost"


class WorkerQuerySet(models.QuerySet["Worker"]):
    def workers(self) -> Self:
        return self.filter(role=WorkerRole.WORKER)

    def sweepers(self) -> Self:
        return self.filter(role=WorkerRole.SWEEPER)

    def alive(self) -> Self:
        return self.filter(status__in=[WorkerStatus.RUNNING, WorkerStatus.STOPPING])

    def not_seen_for(self, seconds: float) -> Self:
        return self.alive().filter(last_seen_at__lt=Now() - timedelta(seconds=seconds))


class Worker(models.Model):
    Role = WorkerRole
    Status = WorkerStatus

    worker_id = models.TextField(primary_key=True)
    role = models.TextField(choices=WorkerRole.choices, default=WorkerRole.WORKER)
    hostname = models.TextField()
    pid = models.IntegerField()
    started_at = models.DateTimeField(db_default=Now())
    last_seen_at = models.DateTimeField(db_default=Now())
    stopped_at = models.DateTimeField(null=True, blank=True)
    status = models.TextField(
        choices=WorkerStatus.choices, default=WorkerStatus.RUNNING, db_default=WorkerStatus.RUNNING
    )
    concurrency = models.IntegerField(default=1, db_default=1)
    work_types = models.JSONField(default=list, blank=True)
    queues = models.JSONField(default=list, blank=True)
    items_completed = models.BigIntegerField(default=0, db_default=0)
    items_failed = models.BigIntegerField(default=0, db_default=0)
    # Sweepers only.
    scans = models.BigIntegerField(default=0, db_default=0)
    items_recovered = models.BigIntegerField(default=0, db_default=0)
    last_scan_at = models.DateTimeField(null=True, blank=True)
    last_scan_stats = models.JSONField(null=True, blank=True)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        db_table = "workers"
        ordering = ["-last_seen_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(role__in=WorkerRole.values), name="workers_role_valid"
            ),
            models.CheckConstraint(
                condition=Q(status__in=WorkerStatus.values), name="workers_status_valid"
            ),
        ]
        indexes = [
            # Not on last_seen_at: every process beat updates it, and an UPDATE
            # that changes no indexed column can be a HOT update.
            models.Index(fields=["role", "status"], name="workers_role_status_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.role} {self.worker_id} ({self.status})"
