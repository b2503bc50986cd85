"""Indexes for the admin dashboard, the work item list and the metrics endpoint.

The design asks the dashboard to stay fast with millions of rows, so every query
it runs reads one of these (or an index of 0001). On PostgreSQL they are built
with CREATE INDEX CONCURRENTLY, so that adding them to a busy `work_items`
table does not block claims and releases while they build; hence `atomic =
False`. SQLite builds them the ordinary way.
"""

from django.db import migrations, models


class AddIndexOnline(migrations.AddIndex):
    """`AddIndex`, built without blocking writes on PostgreSQL."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.add_index(model, self.index, concurrently=True)
        else:
            schema_editor.add_index(model, self.index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.remove_index(model, self.index, concurrently=True)
        else:
            schema_editor.remove_index(model, self.index)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("leasing", "0002_checkpoint_immutability"),
    ]

    operations = [
        # The work item list: newest first, with the primary key as tie-breaker.
        AddIndexOnline(
            model_name="workitem",
            index=models.Index(
                fields=["-created_at", "-work_item_id"], name="work_items_created_idx"
            ),
        ),
        # Throughput over time.
        AddIndexOnline(
            model_name="workitem",
            index=models.Index(
                condition=models.Q(("completed_at__isnull", False)),
                fields=["completed_at", "status"],
                name="work_items_completed_idx",
            ),
        ),
        # Items by status, retry distribution and claims counter (not led by
        # status, so it never competes with the claim index).
        AddIndexOnline(
            model_name="workitem",
            index=models.Index(
                fields=["retry_count", "status", "lease_token"],
                name="work_items_status_retry_idx",
            ),
        ),
    ]
