"""Indexes for the operator console.

`work_items_finished_idx` replaces `work_items_completed_idx`: the same
leading keys (completed_at, status), then queue, work type and lease start as
trailing keys (not INCLUDE, which SQLite lacks), so the queue table's
finished counts and run times of a window are index-only, like throughput.

Built without blocking writes on PostgreSQL (see 0003); hence `atomic = False`.
"""

from importlib import import_module

from django.db import migrations, models

AddIndexOnline = import_module("leasing.migrations.0003_dashboard").AddIndexOnline


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("leasing", "0005_edges"),
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
    ]
