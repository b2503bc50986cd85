"""Periodic work: the `schedules` table, one row per schedule.

Rows come from `LEASING["SCHEDULES"]` (synced by the scheduler when it starts,
`from_settings` true: only `enabled` may change in the admin) or from the
admin. Every write is a statement of `leasing.sql.schedules`; the scheduler
advances `next_run_at` with a compare-and-swap so that each tick enqueues
one item whatever number of schedulers run, and records in `last_error` why
a tick could not be enqueued (for the admin, which cannot see its log).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..ticks import MAX_NAME_LENGTH


class MissedPolicy(models.TextChoices):
    SKIP = "skip", "skip: run the most recent due tick, drop the older missed ones"
    CATCH_UP = "catch_up", "catch up: one item standing for the whole missed period"


class Schedule(models.Model):
    Missed = MissedPolicy

    name = models.CharField(max_length=MAX_NAME_LENGTH, unique=True)
    work_type = models.CharField(max_length=255)
    cron = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="A cron expression (5 fields, or 6 with seconds first), e.g. 0 3 * * *.",
    )
    every = models.PositiveIntegerField(
        null=True, blank=True, help_text="Or: an interval in seconds (instead of cron)."
    )
    timezone = models.CharField(
        max_length=64, default="UTC", help_text="IANA time zone the cron expression reads in."
    )
    payload = models.JSONField(default=dict, blank=True)
    queue_name = models.CharField(max_length=255, default="default")
    missed = models.CharField(
        max_length=16, choices=MissedPolicy.choices, default=MissedPolicy.SKIP
    )
    enabled = models.BooleanField(default=True)
    from_settings = models.BooleanField(default=False, editable=False)
    # Of the settings definition last synced (empty for admin rows).
    fingerprint = models.CharField(max_length=64, blank=True, default="", editable=False)
    next_run_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_tick_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_run_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_work_item_id = models.TextField(null=True, blank=True, editable=False)
    # Why the scheduler's last try at a tick could not enqueue it (one short line), and
    # since when (database clock: the pass that first hit it); cleared when a tick is
    # enqueued, the row is edited or it is switched on again.
    last_error = models.TextField(null=True, blank=True, editable=False)
    last_error_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        db_table = "schedules"
        ordering = ["name"]
        indexes = [
            models.Index(
                fields=["next_run_at"], name="schedules_due_idx", condition=Q(enabled=True)
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron="") & Q(every__isnull=False))
                | (~Q(cron="") & Q(every__isnull=True)),
                name="schedules_cron_or_every",
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def timing_text(self) -> str:
        return self.cron if self.cron else f"every {self.every}s"
