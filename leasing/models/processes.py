"""Worker and sweep processes: the `workers` table."""

from __future__ import annotations

from typing import Self

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..states import WorkerRequest, WorkerRole, WorkerStatus
from .work_items import at_most_key_length


class WorkerQuerySet(models.QuerySet["Worker"]):
    def workers(self) -> Self:
        return self.filter(role=WorkerRole.WORKER)

    def sweepers(self) -> Self:
        return self.filter(role=WorkerRole.SWEEPER)

    def alive(self) -> Self:
        return self.filter(status__in=[WorkerStatus.RUNNING, WorkerStatus.STOPPING])


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
    heartbeat_interval = models.FloatField(
        null=True,
        blank=True,
        help_text="Seconds between this process's own beats; silent after three missed.",
    )
    work_types = models.JSONField(default=list, blank=True)
    queues = models.JSONField(default=list, blank=True)
    items_completed = models.BigIntegerField(default=0, db_default=0)
    items_failed = models.BigIntegerField(default=0, db_default=0)
    # Sweepers only.
    scans = models.BigIntegerField(default=0, db_default=0)
    items_recovered = models.BigIntegerField(default=0, db_default=0)
    last_scan_at = models.DateTimeField(null=True, blank=True)
    last_scan_stats = models.JSONField(null=True, blank=True)
    # Workers only, as of their last beat: runs whose handler is running, and
    # runs fenced out (lease lost, timed out) whose handler thread still runs.
    runs_busy = models.IntegerField(default=0, db_default=0)
    runs_abandoned = models.IntegerField(default=0, db_default=0)
    runs_abandoned_total = models.BigIntegerField(default=0, db_default=0)
    # Since when the worker claims nothing (quiet, stopping, or past its abandoned-run bound).
    quiet_since = models.DateTimeField(null=True, blank=True)
    # An operator's request to the process (read by its next beat), and who asked and why.
    requested_action = models.TextField(choices=WorkerRequest.choices, null=True, blank=True)
    requested_by = models.TextField(null=True, blank=True)
    request_reason = models.TextField(null=True, blank=True)
    requested_at = models.DateTimeField(null=True, blank=True)

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
            models.CheckConstraint(
                condition=Q(requested_action__isnull=True)
                | Q(requested_action__in=WorkerRequest.values),
                name="workers_requested_action_valid",
            ),
            at_most_key_length("worker_id", "workers"),
        ]
        indexes = [
            # Not on last_seen_at: every process beat updates it, and an UPDATE
            # that changes no indexed column can be a HOT update.
            models.Index(fields=["role", "status"], name="workers_role_status_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.role} {self.worker_id} ({self.status})"
