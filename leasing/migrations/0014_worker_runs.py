"""What a worker reports of its runs (busy, abandoned) and an operator's quiet/stop request.

Nullable columns and constant defaults on the small `workers` table: no rewrite.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("leasing", "0013_cancellation"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="quiet_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="request_reason",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="requested_action",
            field=models.TextField(
                blank=True, choices=[("quiet", "Quiet"), ("stop", "Stop")], null=True
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="requested_by",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="runs_abandoned",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="worker",
            name="runs_abandoned_total",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="worker",
            name="runs_busy",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.AddConstraint(
            model_name="worker",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("requested_action__isnull", True),
                    ("requested_action__in", ["quiet", "stop"]),
                    _connector="OR",
                ),
                name="workers_requested_action_valid",
            ),
        ),
    ]
