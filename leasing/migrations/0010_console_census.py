"""Indexes for the dashboard at millions of rows.

* `work_items_finished_idx` gains `retry_count` as a trailing key, so the
  dashboard's retry distribution of its window is index-only, like the
  throughput and the queue table's finished counts.
* `work_items_pending_idx`: pending items by queue and work type, with the
  columns the backlog and the queue table need (deferred, blocked, oldest
  claimable): one index-only scan instead of a scan of the table.

Built without blocking writes on PostgreSQL (see 0003); hence `atomic = False`.
The old finished index is dropped first (the name is reused): until the new
one is built, only the console's history queries are slower.
"""

from importlib import import_module

from django.db import migrations, models

AddIndexOnline = import_module("leasing.migrations.0003_dashboard").AddIndexOnline


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("leasing", "0009_pauses"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="workitem", name="work_items_finished_idx"),
        AddIndexOnline(
            model_name="workitem",
            index=models.Index(
                condition=models.Q(("completed_at__isnull", False)),
                fields=[
                    "completed_at",
                    "status",
                    "queue_name",
                    "work_type",
                    "lease_acquired_at",
                    "retry_count",
                ],
                name="work_items_finished_idx",
            ),
        ),
        AddIndexOnline(
            model_name="workitem",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["queue_name", "work_type", "run_after", "created_at", "dependencies_left"],
                name="work_items_pending_idx",
            ),
        ),
    ]
