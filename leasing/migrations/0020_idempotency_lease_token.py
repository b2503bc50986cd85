"""The lease a pending idempotency key was claimed under: `idempotency_keys.lease_token`.

A pending key's run was judged alive by time (its item's lease acquired no
later than the key's claim); on SQLite's millisecond clock a retry claimed in
the millisecond the dead attempt claimed the key counted as that attempt. A
key claimed under a lease now records the lease's fencing token, and its run
is alive while the item is held under that token: a run is (item, token).

A nullable column without a default: PostgreSQL adds it without rewriting the
table, and SQLite with a plain ALTER TABLE ADD COLUMN. Keys claimed before
keep NULL and are judged by time, as before.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("leasing", "0019_lean_hot_path")]

    operations = [
        migrations.AddField(
            model_name="idempotencykey",
            name="lease_token",
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
