"""The output search index holds only items that have an output.

An item's output is NULL until a handler that returns something completes
it, yet a GIN index enters every row version, NULLs included: each enqueue,
claim and completion of every item wrote into `work_items_output_path_idx`.
Containment (`output_data @> ...`) is false for NULL, so the partial index
answers the console's search as the full one did, and the hot path stops
writing into it for every item without an output.

Built without blocking writes, as 0017 did: the partial index first under a
new name, then the old one dropped, then the new one renamed, so the search
always has an index. Re-runnable after a failure half-way.
"""

from django.db import migrations

NAME = "work_items_output_path_idx"
BUILDING = "work_items_output_path_partial"


def _indexes(schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname IN (%s, %s) AND c.relnamespace = current_schema()::regnamespace",
            [NAME, BUILDING],
        )
        return {name: (valid, definition) for name, valid, definition in cursor.fetchall()}


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    found = _indexes(schema_editor)
    if NAME in found and " WHERE " in found[NAME][1] and found[NAME][0]:
        return  # already partial
    if BUILDING in found and not found[BUILDING][0]:
        schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{BUILDING}"')
    schema_editor.execute(
        f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{BUILDING}" '
        "ON work_items USING gin (output_data jsonb_path_ops) WHERE output_data IS NOT NULL"
    )
    schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{NAME}"')
    schema_editor.execute(f'ALTER INDEX "{BUILDING}" RENAME TO "{NAME}"')


def reverse(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{BUILDING}"')
    schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{NAME}"')
    schema_editor.execute(
        f'CREATE INDEX CONCURRENTLY "{NAME}" ON work_items USING gin (output_data jsonb_path_ops)'
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("leasing", "0017_payload_search")]

    operations = [migrations.RunPython(forward, reverse, elidable=False)]
