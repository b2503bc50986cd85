"""Indexes for the console at millions of rows, and claims filtered by queue or type.

* `work_items_finished_idx` gains `retry_count` as a trailing key, so the
  dashboard's retry distribution of its window is index-only, like the
  throughput and the queue table's finished counts.
* `work_items_claim_idx` gains `queue_name` and `work_type` as trailing keys
  (the claim order is unchanged: the id before them is unique). A claim
  filtered to some queues or work types checks their range on the index entry
  and skips the items of the others without reading the table, and the
  dashboard's backlog and queue table are index-only scans of it.
* `work_items_blocked_idx` gains `queue_name`, `work_type` and `run_after` for
  the same console figures.

Built without blocking writes on PostgreSQL (see 0003); hence `atomic = False`.
A rebuilt index is built under a new name, the old one dropped, then the new
one renamed, so claims always have an index; the finished index is dropped
first (until the new one is built only the console's history is slower).
"""

from importlib import import_module

from django.db import migrations, models
from django.db.models import F, Q
from django.db.models.functions import Coalesce

AddIndexOnline = import_module("leasing.migrations.0003_dashboard").AddIndexOnline


class RemoveIndexOnline(migrations.RemoveIndex):
    """`RemoveIndex`, dropped without blocking claims on PostgreSQL."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        concurrently = schema_editor.connection.vendor == "postgresql"
        schema_editor.remove_index(model, index, **({"concurrently": True} if concurrently else {}))

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        concurrently = schema_editor.connection.vendor == "postgresql"
        schema_editor.add_index(model, index, **({"concurrently": True} if concurrently else {}))


PENDING_UNBLOCKED = Q(("dependencies_left", 0), ("status", "pending"))
PENDING_BLOCKED = Q(("dependencies_left__gt", 0), ("status", "pending"))


def rebuilt(name: str, index: models.Index) -> list[migrations.operations.base.Operation]:
    """Build `index` as `<name>_new`, drop the old `name`, rename the new one to `name`."""
    index.name = f"{name}_new"
    return [
        AddIndexOnline(model_name="workitem", index=index),
        RemoveIndexOnline(model_name="workitem", name=name),
        migrations.RenameIndex(model_name="workitem", new_name=name, old_name=f"{name}_new"),
    ]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("leasing", "0009_pauses"),
    ]

    operations = [
        RemoveIndexOnline(model_name="workitem", name="work_items_finished_idx"),
        AddIndexOnline(
            model_name="workitem",
            index=models.Index(
                condition=Q(("completed_at__isnull", False)),
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
        *rebuilt(
            "work_items_claim_idx",
            models.Index(
                F("priority").desc(),
                Coalesce("run_after", "created_at"),
                "created_at",
                "work_item_id",
                "run_after",
                "queue_name",
                "work_type",
                condition=PENDING_UNBLOCKED,
                name="work_items_claim_idx",
            ),
        ),
        *rebuilt(
            "work_items_blocked_idx",
            models.Index(
                fields=["created_at", "queue_name", "work_type", "run_after"],
                condition=PENDING_BLOCKED,
                name="work_items_blocked_idx",
            ),
        ),
    ]
