"""Paused queues and work types: the `leasing_pauses` table.

One row per pause. A row with `resumed_at` NULL is an active pause: every
claim skips pending items of that queue or work type (a NOT EXISTS against
the partial unique index below, `leasing.sql.pauses`). Resuming fills in the
`resumed_*` columns instead of deleting the row, so the table is its own
audit trail: who paused what, when and why, and who resumed it.

Rows are written only by `leasing.sql.pauses` (through `leasing.pause()` and
`leasing.resume()`).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..states import PauseKind


class PauseQuerySet(models.QuerySet["Pause"]):
    def active(self) -> PauseQuerySet:
        return self.filter(resumed_at__isnull=True)


class Pause(models.Model):
    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=16, choices=PauseKind.choices)
    name = models.CharField(max_length=255)
    paused_by = models.CharField(max_length=150)
    reason = models.TextField()
    paused_at = models.DateTimeField(db_default=Now())
    resumed_by = models.CharField(max_length=150, null=True, blank=True)
    resume_reason = models.TextField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True)

    objects = PauseQuerySet.as_manager()

    class Meta:
        db_table = "leasing_pauses"
        ordering = ("-paused_at", "-id")
        constraints = [
            # At most one active pause per queue or work type; also the index
            # the claim's NOT EXISTS probes (tiny: active pauses only).
            models.UniqueConstraint(
                fields=["kind", "name"],
                condition=Q(resumed_at__isnull=True),
                name="leasing_pauses_active_uniq",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=PauseKind.values), name="leasing_pauses_kind_valid"
            ),
        ]
        indexes = [models.Index(fields=["-paused_at"], name="leasing_pauses_paused_at_idx")]

    def __str__(self) -> str:
        state = "active" if self.resumed_at is None else "resumed"
        return f"{self.get_kind_display()} {self.name} paused ({state})"

    @property
    def active(self) -> bool:
        return self.resumed_at is None
