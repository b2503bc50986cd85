"""Idempotency keys: the `idempotency_keys` table."""

from __future__ import annotations

from typing import Self

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..states import IdempotencyStatus
from .work_items import WorkItem


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
