"""A database-side check of the state machine, installed on the test database.

Triggers on `work_items` record every change of status (an insert is a move
from "new", a delete one to "gone") that `leasing.transitions` does not
declare into `leasing_test_violations`. They record rather than raise, so a
move made by a worker subprocess, or by code that logs and carries on, is
caught as surely as one in the test's own thread; `tests/conftest.py` fails
the test that left a record. Moves into a status the schema does not know
are left to its CHECK constraint.

A test that arranges rows directly (a finished item dated last year) does
it inside `arranging()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import connection, transaction

from leasing.transitions import GONE, NEW, RESTING, allowed_moves

VIOLATIONS = "leasing_test_violations"
ARRANGING = "leasing_test_arranging"


def _moves_sql() -> str:
    return ", ".join(f"'{a}>{b}'" for a, b in sorted(allowed_moves()))


def _known_sql() -> str:
    return ", ".join(f"'{s}'" for s in (*RESTING, GONE))


def _postgres() -> list[str]:
    return [
        f"CREATE TABLE IF NOT EXISTS {VIOLATIONS} (move text, work_item_id text)",
        f"CREATE TABLE IF NOT EXISTS {ARRANGING} (since timestamptz)",
        f"""
        CREATE OR REPLACE FUNCTION leasing_test_guard() RETURNS trigger AS $$
        DECLARE
            was text := CASE WHEN TG_OP = 'INSERT' THEN '{NEW}' ELSE OLD.status END;
            now_ text := CASE WHEN TG_OP = 'DELETE' THEN '{GONE}' ELSE NEW.status END;
            item text := CASE WHEN TG_OP = 'DELETE' THEN OLD.work_item_id
                              ELSE NEW.work_item_id END;
        BEGIN
            IF was IS DISTINCT FROM now_ AND now_ IN ({_known_sql()})
               AND (was || '>' || now_) NOT IN ({_moves_sql()})
               AND NOT EXISTS (SELECT 1 FROM {ARRANGING}) THEN
                INSERT INTO {VIOLATIONS} VALUES (was || ' -> ' || now_, item);
            END IF;
            RETURN NULL;
        END $$ LANGUAGE plpgsql
        """,
        "DROP TRIGGER IF EXISTS leasing_test_guard ON work_items",
        """
        CREATE TRIGGER leasing_test_guard
        AFTER INSERT OR UPDATE OF status OR DELETE ON work_items
        FOR EACH ROW EXECUTE FUNCTION leasing_test_guard()
        """,
    ]


def _sqlite() -> list[str]:
    unarranged = f"NOT EXISTS (SELECT 1 FROM {ARRANGING})"
    statements = [
        f"CREATE TABLE IF NOT EXISTS {VIOLATIONS} (move text, work_item_id text)",
        f"CREATE TABLE IF NOT EXISTS {ARRANGING} (since text)",
    ]
    for name, event, was, now, item in (
        ("insert", "INSERT", f"'{NEW}'", "NEW.status", "NEW.work_item_id"),
        ("update", "UPDATE OF status", "OLD.status", "NEW.status", "NEW.work_item_id"),
        ("delete", "DELETE", "OLD.status", f"'{GONE}'", "OLD.work_item_id"),
    ):
        statements += [
            f"DROP TRIGGER IF EXISTS leasing_test_guard_{name}",
            f"""
            CREATE TRIGGER leasing_test_guard_{name} AFTER {event} ON work_items
            WHEN {was} IS NOT {now} AND {now} IN ({_known_sql()})
                 AND ({was} || '>' || {now}) NOT IN ({_moves_sql()}) AND {unarranged}
            BEGIN
                INSERT INTO {VIOLATIONS} VALUES ({was} || ' -> ' || {now}, {item});
            END
            """,
        ]
    return statements


def install() -> None:
    """Create the triggers and their tables on the test database (idempotent)."""
    statements = _postgres() if connection.vendor == "postgresql" else _sqlite()
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def violations() -> list[tuple[Any, ...]]:
    """The undeclared moves recorded so far."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT move, work_item_id FROM {VIOLATIONS}")
        return list(cursor.fetchall())


def clear() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {VIOLATIONS}")


@contextlib.contextmanager
def arranging() -> Iterator[None]:
    """Write rows directly (test set-up, not a transition) without being recorded."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {ARRANGING} VALUES (NULL)")
        yield  # on an error the transaction rolls the marker back with the rest
        cursor.execute(f"DELETE FROM {ARRANGING}")
