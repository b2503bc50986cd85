"""Leases get a deadline and items count interruptions; processes record their beat interval.

* `work_items.lease_deadline_at`: the most a lease can live (claim time plus
  the type's timeout or MAX_LEASE_LIFETIME); no renewal moves the expiry past
  it. Leases held while this migration runs get four hours from their expiry.
* `work_items.interruptions`: attempts in a row cut short by the database,
  which do not count as retries.
* `workers.heartbeat_interval`: a process is silent after three of its own.
* The claim index follows the claim order: priority, then when the item
  became available (`COALESCE(run_after, created_at)`), then enqueue order.
* Text keys are at most 255 characters (CHECK constraints).
"""

from datetime import timedelta

import django.db.models.functions.comparison
import django.db.models.functions.text
import django.db.models.lookups
from django.db import migrations, models


SQLITE_CHECKPOINT_TRIGGER = """
CREATE TRIGGER checkpoints_refuse_update
BEFORE UPDATE ON checkpoints
BEGIN
    SELECT RAISE(ABORT, 'checkpoints are append-only: UPDATE refused');
END;
"""


def deadline_for_held_leases(apps, schema_editor):
    WorkItem = apps.get_model("leasing", "WorkItem")
    WorkItem.objects.using(schema_editor.connection.alias).filter(
        status="in_progress", lease_deadline_at__isnull=True
    ).update(lease_deadline_at=models.F("lease_expires_at") + timedelta(hours=4))


def recreate_sqlite_checkpoint_trigger(apps, schema_editor):
    # SQLite adds a CHECK constraint by rebuilding the table, which drops its
    # triggers: put back the one that keeps checkpoints append-only.
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS checkpoints_refuse_update;")
        schema_editor.execute(SQLITE_CHECKPOINT_TRIGGER)


class Migration(migrations.Migration):

    dependencies = [
        ('leasing', '0004_postgres_storage'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='workitem',
            name='work_items_in_progress_has_lease',
        ),
        migrations.RemoveConstraint(
            model_name='workitem',
            name='work_items_retries_non_negative',
        ),
        migrations.RemoveIndex(
            model_name='workitem',
            name='work_items_claim_idx',
        ),
        migrations.AddField(
            model_name='worker',
            name='heartbeat_interval',
            field=models.FloatField(blank=True, help_text="Seconds between this process's own beats; silent after three missed.", null=True),
        ),
        migrations.AddField(
            model_name='workitem',
            name='interruptions',
            field=models.IntegerField(db_default=0, default=0, help_text='Attempts in a row cut short by the database (not counted as retries).'),
        ),
        migrations.AddField(
            model_name='workitem',
            name='lease_deadline_at',
            field=models.DateTimeField(blank=True, help_text='The most the lease can live: claim time + timeout or MAX_LEASE_LIFETIME.', null=True),
        ),
        migrations.RunPython(deadline_for_held_leases, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name='workitem',
            index=models.Index(models.OrderBy(models.F('priority'), descending=True), django.db.models.functions.comparison.Coalesce('run_after', 'created_at'), models.F('created_at'), models.F('work_item_id'), models.F('run_after'), condition=models.Q(('status', 'pending')), name='work_items_claim_idx'),
        ),
        migrations.AddConstraint(
            model_name='checkpoint',
            constraint=models.CheckConstraint(condition=django.db.models.lookups.LessThanOrEqual(django.db.models.functions.text.Length('task_id'), 255), name='checkpoints_task_id_length'),
        ),
        migrations.AddConstraint(
            model_name='worker',
            constraint=models.CheckConstraint(condition=django.db.models.lookups.LessThanOrEqual(django.db.models.functions.text.Length('worker_id'), 255), name='workers_worker_id_length'),
        ),
        migrations.AddConstraint(
            model_name='workitem',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('status', 'in_progress'), _negated=True), models.Q(('lease_deadline_at__isnull', False), ('lease_expires_at__isnull', False), ('lease_holder__isnull', False)), _connector='OR'), name='work_items_in_progress_has_lease'),
        ),
        migrations.AddConstraint(
            model_name='workitem',
            constraint=models.CheckConstraint(condition=models.Q(('interruptions__gte', 0), ('max_retries__gte', 0), ('retry_count__gte', 0)), name='work_items_counts_non_negative'),
        ),
        migrations.AddConstraint(
            model_name='workitem',
            constraint=models.CheckConstraint(condition=django.db.models.lookups.LessThanOrEqual(django.db.models.functions.text.Length('task_id'), 255), name='work_items_task_id_length'),
        ),
        migrations.AddConstraint(
            model_name='workitem',
            constraint=models.CheckConstraint(condition=django.db.models.lookups.LessThanOrEqual(django.db.models.functions.text.Length('work_type'), 255), name='work_items_work_type_length'),
        ),
        migrations.AddConstraint(
            model_name='workitem',
            constraint=models.CheckConstraint(condition=django.db.models.lookups.LessThanOrEqual(django.db.models.functions.text.Length('queue_name'), 255), name='work_items_queue_name_length'),
        ),
        migrations.AddConstraint(
            model_name='workitem',
            constraint=models.CheckConstraint(condition=django.db.models.lookups.LessThanOrEqual(django.db.models.functions.text.Length('lease_holder'), 255), name='work_items_lease_holder_length'),
        ),
        migrations.RunPython(recreate_sqlite_checkpoint_trigger, migrations.RunPython.noop),
    ]
