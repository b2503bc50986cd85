"""Checkpoints: the append-only `checkpoints` table."""

from __future__ import annotations

from typing import Any, Self

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..exceptions import CheckpointImmutable
from ..ids import new_ulid
from ..states import CheckpointType
from .work_items import WorkItem, at_most_key_length


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
            at_most_key_length("task_id", "checkpoints"),
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
