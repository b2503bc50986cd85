"""The claim index led by the work type (`work_items_claim_type_idx`).

A claim filtered to a few work types reads each type's pending items in claim
order from it (`leasing.sql.candidates`), instead of walking the items of
every other type that come first in the claim index. Built without blocking
writes on PostgreSQL (see 0003); hence `atomic = False`.
"""

from importlib import import_module

from django.db import migrations, models
from django.db.models import F, Q
from django.db.models.functions import Coalesce

AddIndexOnline = import_module("leasing.migrations.0003_dashboard").AddIndexOnline


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("leasing", "0011_finished_hours"),
    ]

    operations = [
        AddIndexOnline(
            model_name="workitem",
            index=models.Index(
                "work_type",
                F("priority").desc(),
                Coalesce("run_after", "created_at"),
                "created_at",
                "work_item_id",
                "run_after",
                "queue_name",
                condition=Q(("dependencies_left", 0), ("status", "pending")),
                name="work_items_claim_type_idx",
            ),
        ),
    ]
