"""Finished items rolled up per hour: the `leasing_finished_hours` table.

The console's day and week windows would otherwise read every item finished
in them (150,000 a week at 15 a minute) on each page view. The sweep folds
each closed hour once (`leasing.services.rollups`): per (hour, queue, work
type, status) the number of items, their retry counts, and the run times of
the completed ones as a log-scale histogram. The pages then read a few
hundred of these rows plus the items finished since the last rolled hour.

An hour's row describes what happened in it and is not rewritten: an item
that failed at 10:20 and was retried by an operator at 11:00 stays a failure
of the 10:00 hour. Rows are written only by `leasing.sql.rollups`.
"""

from __future__ import annotations

from django.db import models


class FinishedHour(models.Model):
    id = models.BigAutoField(primary_key=True)
    hour = models.DateTimeField()  # start of the hour (UTC), by completed_at
    queue_name = models.CharField(max_length=255)
    work_type = models.CharField(max_length=255)
    status = models.CharField(max_length=20)  # completed or failed
    items = models.PositiveIntegerField()
    # Completed items with a run time (completed_at - lease_acquired_at), and its sum.
    timed = models.PositiveIntegerField(default=0)
    run_seconds = models.FloatField(default=0.0)
    # {retry_count: items} and {histogram bucket: timed items} (leasing.services.rollups).
    retries = models.JSONField(default=dict)
    run_histogram = models.JSONField(default=dict)
    # [items] per quarter of the hour: the console's peak hours in any time zone.
    quarters = models.JSONField(default=list)

    class Meta:
        db_table = "leasing_finished_hours"
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "queue_name", "work_type", "status"],
                name="leasing_finished_hours_uniq",
            )
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00} {self.queue_name}/{self.work_type} {self.status}"


class RollupMark(models.Model):
    """How far a periodic pass has gone (`leasing.sql.marks`).

    `finished_hours`: every hour before `through` is rolled up.
    `checkpoint_cleanup:N` / `checkpoint_full_cleanup:N`: the sweep's last
    checkpoint cleanup to retention N (the last that read every task) began
    at `through`.
    """

    name = models.CharField(max_length=64, primary_key=True)
    through = models.DateTimeField(null=True)

    class Meta:
        db_table = "leasing_rollup_marks"

    def __str__(self) -> str:
        return f"{self.name} through {self.through}"
