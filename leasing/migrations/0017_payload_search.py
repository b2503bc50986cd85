"""GIN indexes for the console's search in payloads (`?input__customer=acme`), no-op on
SQLite; the operators' permission named for the delete and run-now actions too.

`input_data @> '{"customer": "acme"}'` is answered from a GIN index with the
`jsonb_path_ops` operator class (a hash of each path to a value: smaller and
faster for containment than the default `jsonb_ops`, and containment is the
only test the search makes). The cost: every enqueue writes one more index
entry per key of its input, and every completion one per key of its output
(GIN's pending list batches them), and the indexes take disk roughly in
proportion to the payloads' keys and values.

Built without blocking writes (CREATE INDEX CONCURRENTLY), hence `atomic =
False`; a build that failed half-way leaves an invalid index, which is dropped
and built again. Not in the model's Meta: Django's SQLite schema has no GIN.
"""

from django.db import migrations

INDEXES = {
    "work_items_input_path_idx": "input_data",
    "work_items_output_path_idx": "output_data",
}


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, column in INDEXES.items():
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace",
                [name],
            )
            found = cursor.fetchone()
        if found is not None and not found[0]:
            schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
        schema_editor.execute(
            f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{name}" '
            f'ON work_items USING gin ("{column}" jsonb_path_ops)'
        )


def reverse(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in INDEXES:
        schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("leasing", "0016_rate_limits")]

    operations = [
        migrations.RunPython(forward, reverse, elidable=False),
        # The operators' permission also covers the delete and run-now actions.
        migrations.AlterModelOptions(
            name="workitem",
            options={
                "get_latest_by": "created_at",
                "ordering": ["-created_at"],
                "permissions": [
                    (
                        "force_release_workitem",
                        "Can force-release, force-fail, retry, cancel, delete and run now "
                        "work items",
                    ),
                    ("view_payload", "Can view work item and checkpoint payloads"),
                ],
            },
        ),
    ]
