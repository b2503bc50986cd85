"""Rate limits and fair claims: `work_items.rate_key` and `fairness_key`, the bucket table
`leasing_rate_buckets`, the fair queues' claim index (`work_items_fair_idx`) and the
console's index of the items waiting on a rate key (`work_items_rate_key_idx`).

The new columns are NULL (no rewrite); the indexes are built without blocking
writes on PostgreSQL (see 0003); hence `atomic = False`.
"""

from importlib import import_module

from django.db import migrations, models
from django.db.models import F, Q
from django.db.models.functions import Coalesce, Now

AddIndexOnline = import_module("leasing.migrations.0003_dashboard").AddIndexOnline


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("leasing", "0015_trace_context"),
    ]

    operations = [
        migrations.CreateModel(
            name="RateBucket",
            fields=[
                ("bucket", models.TextField(primary_key=True, serialize=False)),
                ("tat", models.FloatField(db_default=0.0, default=0.0)),
                ("next_at", models.FloatField(db_default=0.0, default=0.0)),
                ("limit_count", models.IntegerField(blank=True, null=True)),
                ("period_seconds", models.FloatField(blank=True, null=True)),
                ("burst", models.IntegerField(blank=True, null=True)),
                ("admitted", models.BigIntegerField(db_default=0, default=0)),
                ("window_start", models.FloatField(db_default=0.0, default=0.0)),
                ("window_admitted", models.IntegerField(db_default=0, default=0)),
                ("previous_admitted", models.IntegerField(db_default=0, default=0)),
                ("updated_at", models.DateTimeField(db_default=Now())),
            ],
            options={
                "db_table": "leasing_rate_buckets",
                "ordering": ("bucket",),
                "indexes": [
                    models.Index(fields=["next_at"], name="leasing_rate_buckets_next_idx")
                ],
            },
        ),
        migrations.AddField(
            model_name="workitem",
            name="fairness_key",
            field=models.TextField(
                blank=True,
                help_text="The tenant: in a fair queue, claims take turns across these keys.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="workitem",
            name="rate_key",
            field=models.TextField(
                blank=True,
                help_text="Claims of items with this key are held to its rate limit (LEASING "
                "RATE_LIMITS 'key:...' or the enqueue's rate_limit).",
                null=True,
            ),
        ),
        AddIndexOnline(
            model_name="workitem",
            index=models.Index(
                fields=["rate_key"],
                condition=Q(("rate_key__isnull", False), ("status", "pending")),
                name="work_items_rate_key_idx",
            ),
        ),
        AddIndexOnline(
            model_name="workitem",
            index=models.Index(
                "queue_name",
                "fairness_key",
                F("priority").desc(),
                Coalesce("run_after", "created_at"),
                "created_at",
                "work_item_id",
                "run_after",
                condition=Q(("dependencies_left", 0), ("status", "pending")),
                name="work_items_fair_idx",
            ),
        ),
    ]
