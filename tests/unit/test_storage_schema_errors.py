"""Telling a database that lacks leasing's schema from other errors, by the driver's own
error: SQLite's "no such table / column" (a real sqlite3 connection), and nothing else."""

from __future__ import annotations

import sqlite3

import pytest

from leasing.storage.sqlite import SQLiteStorage


def error_of(statement: str) -> sqlite3.Error:
    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE present (a INTEGER)")
    with pytest.raises(sqlite3.Error) as raised:
        connection.execute(statement)
    return raised.value


@pytest.mark.parametrize(
    "statement", ["SELECT * FROM work_items", "SELECT lease_token FROM present"]
)
def test_a_missing_table_or_column_is_a_lacking_schema(statement):
    assert SQLiteStorage.lacks_schema(error_of(statement))


@pytest.mark.parametrize("statement", ["SELEC 1", "INSERT INTO present VALUES (1, 2)"])
def test_other_errors_are_not(statement):
    assert not SQLiteStorage.lacks_schema(error_of(statement))
