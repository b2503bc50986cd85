"""PostgreSQL storage settings for the hot tables (issue 6). No-op on SQLite.

* `work_items` and `workers` are updated all the time (claims, renewals,
  releases, process beats). A fillfactor below 100 leaves room on each page so
  that an UPDATE changing no indexed column (a renewal that keeps its expiry,
  a process beat) can be a HOT update: no index writes, no index bloat.
* Per-table autovacuum: vacuum and analyze after 2% of the rows changed
  instead of 20%/10%, so dead tuples of finished claims do not pile up in the
  claim index and the planner's statistics follow bursts of enqueues. (Only
  where the server runs autovacuum at all: `autovacuum = on`.)
* Django adds a `text_pattern_ops` ("_like") index next to every indexed text
  column, for `LIKE 'prefix%'` lookups. Nothing here looks up ids by prefix,
  and each such index is one more write per insert and per non-HOT update.
"""

from django.db import migrations

TABLES = ("work_items", "checkpoints", "idempotency_keys", "workers")

FORWARD = """
ALTER TABLE work_items SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05
);
ALTER TABLE workers SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.1);
"""
REVERSE = """
ALTER TABLE work_items RESET (
    fillfactor,
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold,
    autovacuum_analyze_scale_factor,
    autovacuum_analyze_threshold,
    autovacuum_vacuum_insert_scale_factor
);
ALTER TABLE workers RESET (fillfactor, autovacuum_vacuum_scale_factor);
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(FORWARD)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes "
            "WHERE schemaname = current_schema() AND tablename = ANY(%s) "
            "AND indexname LIKE %s",
            [list(TABLES), "%\\_like"],
        )
        names = [row[0] for row in cursor.fetchall()]
    for name in names:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


def reverse(apps, schema_editor):
    # The "_like" indexes are not recreated: nothing needs them.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REVERSE)


class Migration(migrations.Migration):
    dependencies = [("leasing", "0003_dashboard")]

    operations = [migrations.RunPython(forward, reverse)]
