"""Fewer index entries for each claim and completion.

A claim or completion rewrites the row (never a HOT update: `status` is in
nearly every index), so each index whose condition holds for the new row
version gets an entry. This trims what every item paid for on the way through:

* `work_items_holder_idx` (lease_holder, status) is gone: its rows were the
  in-flight ones, so `work_items_in_flight_idx` now carries `lease_holder`
  after (queue_name, work_type). A limit's count still reads its queue's
  range; a holder's leases are found among the in-flight entries alone.
* `work_items_status_retry_idx` leaves out in-flight rows
  (`NOT status = 'in_progress'`): a claim no longer enters it; the census
  counts in-flight rows through `work_items_in_flight_idx`.
* `work_items_input_path_idx` holds only items that have a payload, as 0018
  made the output index hold only items with an output (containment is false
  for NULL, so the search answers as before).

On PostgreSQL each index is built without blocking writes under a new name,
then the old one is dropped and the new one renamed, so every query keeps an
index; re-runnable after a failure half-way (hence `atomic = False`).
"""

from django.db import migrations, models
from django.db.models import Q

IN_FLIGHT = "work_items_in_flight_idx"
STATUS_RETRY = "work_items_status_retry_idx"
INPUT_PATH = "work_items_input_path_idx"
HOLDER = "work_items_holder_idx"

# name -> (the new definition, the old one); each `ON work_items ...`.
REBUILT = {
    IN_FLIGHT: (
        "(queue_name, work_type, lease_holder) WHERE status = 'in_progress'",
        "(queue_name, work_type) WHERE status = 'in_progress'",
    ),
    STATUS_RETRY: (
        "(retry_count, status, lease_token) WHERE NOT (status = 'in_progress')",
        "(retry_count, status, lease_token)",
    ),
}
GIN = {
    INPUT_PATH: (
        "USING gin (input_data jsonb_path_ops) WHERE input_data IS NOT NULL",
        "USING gin (input_data jsonb_path_ops)",
    ),
}
OLD_HOLDER = "(lease_holder, status) WHERE lease_holder IS NOT NULL"


def _swap(schema_editor, name: str, definition: str) -> None:
    """Build `definition` as `name` without blocking writes, replacing what is there."""
    building = f"{name}_new"
    schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{building}"')
    schema_editor.execute(f'CREATE INDEX CONCURRENTLY "{building}" ON work_items {definition}')
    schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
    schema_editor.execute(f'ALTER INDEX "{building}" RENAME TO "{name}"')


def _replace(schema_editor, name: str, definition: str) -> None:
    schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')
    schema_editor.execute(f'CREATE INDEX "{name}" ON work_items {definition}')


def _apply(schema_editor, which: int) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    for name, definitions in REBUILT.items():
        (_swap if postgres else _replace)(schema_editor, name, definitions[which])
    if postgres:  # the payload search index is PostgreSQL's alone (0017)
        for name, definitions in GIN.items():
            _swap(schema_editor, name, definitions[which])
    concurrently = "CONCURRENTLY " if postgres else ""
    if which == 0:
        schema_editor.execute(f'DROP INDEX {concurrently}IF EXISTS "{HOLDER}"')
    else:
        schema_editor.execute(
            f'CREATE INDEX {concurrently}IF NOT EXISTS "{HOLDER}" ON work_items {OLD_HOLDER}'
        )


def forward(apps, schema_editor):
    _apply(schema_editor, 0)


def reverse(apps, schema_editor):
    _apply(schema_editor, 1)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("leasing", "0018_output_search_partial")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, reverse, elidable=False)],
            state_operations=[
                migrations.RemoveIndex(model_name="workitem", name=HOLDER),
                migrations.RemoveIndex(model_name="workitem", name=IN_FLIGHT),
                migrations.AddIndex(
                    model_name="workitem",
                    index=models.Index(
                        fields=["queue_name", "work_type", "lease_holder"],
                        condition=Q(status="in_progress"),
                        name=IN_FLIGHT,
                    ),
                ),
                migrations.RemoveIndex(model_name="workitem", name=STATUS_RETRY),
                migrations.AddIndex(
                    model_name="workitem",
                    index=models.Index(
                        fields=["retry_count", "status", "lease_token"],
                        condition=~Q(status="in_progress"),
                        name=STATUS_RETRY,
                    ),
                ),
            ],
        ),
    ]
