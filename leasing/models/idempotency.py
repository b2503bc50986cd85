"""Idempotency keys: the `idempotency_keys` table."""

from __future__ import annotations

from typing import Self

from django.db import models
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now

from ..states import IdempotencyStatus, WorkItemStatus
from .work_items import DB_SET_NULL, WorkItem


def _past_expiry() -> Q:
    """Expired as the engine judges it (`leasing.sql.idempotency`): past `expires_at`,
    unless the key's work item may run again (anything but completed: pending or in
    progress, or failed or cancelled, which an operator may retry), whose run still
    needs the key."""
    may_run_again = WorkItem.objects.filter(pk=OuterRef("work_item_id")).exclude(
        status=WorkItemStatus.COMPLETED
    )
    return Q(Q(expires_at__isnull=False, expires_at__lte=Now()), ~Exists(may_run_again))


class IdempotencyKeyQuerySet(models.QuerySet["IdempotencyKey"]):
    def expired(self) -> Self:
        """Keys the sweep deletes (`delete_expired_keys`) and a call takes over afresh."""
        return self.filter(_past_expiry())

    def live(self) -> Self:
        """Keys still remembered: not yet past `expires_at`, or their item may run again."""
        return self.exclude(_past_expiry())


class IdempotencyKey(models.Model):
    Status = IdempotencyStatus

    idempotency_key = models.CharField(max_length=255, primary_key=True)
    task_id = models.TextField(null=True, blank=True)
    work_item = models.ForeignKey(
        WorkItem,
        null=True,
        blank=True,
        on_delete=DB_SET_NULL,
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
    # The fencing token of the lease the key was claimed under (None: no lease):
    # its pending run is alive while the item is still held under this token.
    lease_token = models.BigIntegerField(null=True, blank=True)

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
