"""Cancellation: the final status `cancelled`, and `cancel_requested_at` for a running item
asked to stop (its run ends `cancelled`).

The status check is replaced without blocking writes on PostgreSQL: added
`NOT VALID` (a brief lock, no scan), then validated, which scans the table
under a lock that lets enqueues and claims go on; hence `atomic = False`.
"""

from django.db import migrations, models


class AddCheckOnline(migrations.AddConstraint):
    """`AddConstraint` of a check, validated without blocking writes on PostgreSQL."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.add_constraint(model, self.constraint)
            return
        table = schema_editor.quote_name(model._meta.db_table)
        name = schema_editor.quote_name(self.constraint.name)
        schema_editor.execute(f"{self.constraint.create_sql(model, schema_editor)} NOT VALID")
        schema_editor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


STATUSES = ["pending", "in_progress", "completed", "failed", "cancelled", "expired"]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("leasing", "0012_claim_type_index"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="workitem",
            name="work_items_status_valid",
        ),
        migrations.AddField(
            model_name="workitem",
            name="cancel_requested_at",
            field=models.DateTimeField(
                blank=True,
                help_text="Someone cancelled this item while it ran: its handler is told within "
                "one heartbeat interval, and its run ends cancelled.",
                null=True,
                verbose_name="asked to stop at",
            ),
        ),
        migrations.AlterField(
            model_name="workitem",
            name="status",
            field=models.TextField(
                choices=[
                    ("pending", "Pending"),
                    ("in_progress", "In progress"),
                    ("completed", "Completed"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                    ("expired", "Expired"),
                ],
                db_default="pending",
                default="pending",
            ),
        ),
        AddCheckOnline(
            model_name="workitem",
            constraint=models.CheckConstraint(
                condition=models.Q(("status__in", STATUSES)), name="work_items_status_valid"
            ),
        ),
        migrations.AlterModelOptions(
            name="workitem",
            options={
                "get_latest_by": "created_at",
                "ordering": ["-created_at"],
                "permissions": [
                    (
                        "force_release_workitem",
                        "Can force-release, force-fail, retry and cancel work items",
                    ),
                    ("view_payload", "Can view work item and checkpoint payloads"),
                ],
            },
        ),
    ]
