"""Nothing outside the storage boundary (`leasing.storage`) asks which database it runs on.

The differences between PostgreSQL and SQLite live in one class per database;
everything else asks a storage for a fragment, a statement or a capability.
Migrations are the exception Django makes: each states its own schema per
database.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import leasing

PACKAGE = Path(leasing.__file__).parent
INSIDE = ("storage", "migrations")
DATABASE_NAMES = {"postgresql", "postgres", "sqlite", "sqlite3", "mysql", "oracle"}


def _outside() -> list[Path]:
    return sorted(
        path for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).parts[0] not in INSIDE
    )


def vendor_questions(source: str) -> list[str]:
    """Where `source` asks which database it runs on: `.vendor`, or a database's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "vendor":
            found.append(f"line {node.lineno}: reads .vendor")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.lower() in DATABASE_NAMES
        ):
            found.append(f"line {node.lineno}: names {node.value!r}")
    return found


def test_the_check_finds_each_way_of_asking():
    assert vendor_questions("if connection.vendor == 'x': pass") == ["line 1: reads .vendor"]
    assert vendor_questions("ok = type(e).__module__.startswith('sqlite3')") == [
        "line 1: names 'sqlite3'"
    ]
    assert vendor_questions("d.claim(holder, n)  # on PostgreSQL") == []


@pytest.mark.parametrize("path", _outside(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_outside_the_storage_asks_which_database_it_runs_on(path):
    assert vendor_questions(path.read_text()) == []
