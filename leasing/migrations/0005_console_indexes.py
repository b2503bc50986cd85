"""Indexes for the operator console (queue table, history charts).

* `work_items_pending_queue_idx`: pending items by queue and work type, so the
  queue table counts them with an index-only scan.
* `work_items_finished_idx` replaces `work_items_completed_idx`: the same
  leading keys, then queue, work type and lease start (trailing keys, not
  INCLUDE, which SQLite lacks), so the
  queue table's finished counts and run times of a window are index-only too.

Built without blocking writes on PostgreSQL (see 0003); hence `atomic = False`.
"""

from importlib import import_module

from django.db import migrations, models

AddIndexOnline = import_module("leasing.migrations.0003_dashboard").AddIndexOnline


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("leasing", "0004_postgres_storage"),
    ]

    operations = [
        AddIndexOnline(
            model_name="workitem",
            index=models.Index(
                condition=models.Q(("completed_at__isnull", False)),
                fields=["completed_at", "status", "queue_name", "work_type", "lease_acquired_at"],
                name="work_items_finished_idx",
            ),
        ),
        migrations.RemoveIndex(model_name="workitem", name="work_items_completed_idx"),
        AddIndexOnline(
            model_name="workitem",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["queue_name", "work_type", "created_at", "run_after"],
                name="work_items_pending_queue_idx",
            ),
        ),
    ]
