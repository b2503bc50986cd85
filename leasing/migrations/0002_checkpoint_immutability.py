"""Checkpoints are append-only: a trigger refuses UPDATE even from raw SQL.

PostgreSQL gets a PL/pgSQL trigger raising an integrity error; SQLite gets the
equivalent RAISE(ABORT) trigger, so both databases behave alike.
"""

from django.db import migrations

POSTGRES_FORWARD = """
CREATE OR REPLACE FUNCTION leasing_checkpoints_refuse_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = 'checkpoints are append-only: UPDATE of checkpoint '
                  || OLD.checkpoint_id || ' refused',
        ERRCODE = 'integrity_constraint_violation';
END;
$$;
CREATE TRIGGER checkpoints_refuse_update
    BEFORE UPDATE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION leasing_checkpoints_refuse_update();
"""
POSTGRES_REVERSE = """
DROP TRIGGER IF EXISTS checkpoints_refuse_update ON checkpoints;
DROP FUNCTION IF EXISTS leasing_checkpoints_refuse_update();
"""
SQLITE_FORWARD = """
CREATE TRIGGER checkpoints_refuse_update
BEFORE UPDATE ON checkpoints
BEGIN
    SELECT RAISE(ABORT, 'checkpoints are append-only: UPDATE refused');
END;
"""
SQLITE_REVERSE = "DROP TRIGGER IF EXISTS checkpoints_refuse_update;"


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRES_FORWARD)
    elif vendor == "sqlite":
        schema_editor.execute(SQLITE_FORWARD)


def reverse(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRES_REVERSE)
    elif vendor == "sqlite":
        schema_editor.execute(SQLITE_REVERSE)


class Migration(migrations.Migration):
    dependencies = [("leasing", "0001_initial")]

    operations = [migrations.RunPython(forward, reverse)]
