"""Why a schedule's last tick could not be enqueued: `schedules.last_error(_at)`.

The scheduler logged such a failure and retried each pass, but the admin,
which cannot read the scheduler's log, could only guess the reason (from its
own handler registry). The scheduler now records the failure's one-line text
and the database clock's time; enqueueing a tick, or an edit, clears them.

Nullable columns without a default: PostgreSQL adds them without rewriting
the table, and SQLite with a plain ALTER TABLE ADD COLUMN. Existing rows have
no recorded failure.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("leasing", "0020_idempotency_lease_token")]

    operations = [
        migrations.AddField(
            model_name="schedule",
            name="last_error",
            field=models.TextField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="schedule",
            name="last_error_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
