"""`LEASING["READ_DATABASE"]`: the console reads from another alias, leases stay on the primary.

A second alias, `replica`, points at the test database itself (a test mirror
of `default`), so every page works and the queries each alias receives tell
where a page read from: the console's pages and `/metrics` read the leasing
tables only through `replica`; an operator action reads what it fences on,
and writes, only through `default`. Runs on SQLite and PostgreSQL (the
replica connection is a second session, so these tests commit: transaction
tests). A real streaming replica, behind and paused, is tests/ha/test_replica.py.
"""

from __future__ import annotations

import re

import pytest
from django.core import checks
from django.db import connections
from django.test.utils import CaptureQueriesContext

from leasing.checks import check_settings
from leasing.conf import WRITE_DATABASE, read_alias, read_settings
from leasing.console.replica import ReplicaLag, parse_lsn

REPLICA = "replica"
LEASING_TABLES = {"work_items", "checkpoints", "idempotency_keys", "workers"}
TABLE = re.compile(r'\b(?:FROM|JOIN|UPDATE|INTO)\s+"?([a-z_]+)"?', re.IGNORECASE)
WRITE = re.compile(r'^\s*(?:UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+"?([a-z_]+)"?', re.IGNORECASE)


class Seen:
    """The leasing tables each alias read and wrote during one block."""

    def __init__(self) -> None:
        self.captures = {alias: CaptureQueriesContext(connections[alias]) for alias in connections}

    def __enter__(self) -> Seen:
        for capture in self.captures.values():
            capture.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for capture in self.captures.values():
            capture.__exit__(*exc)

    def _sql(self, alias: str) -> list[str]:
        return [q["sql"] for q in self.captures[alias].captured_queries]

    def read(self, alias: str) -> set[str]:
        return {t for sql in self._sql(alias) for t in TABLE.findall(sql)} & LEASING_TABLES

    def written(self, alias: str) -> set[str]:
        return {t for sql in self._sql(alias) for t in WRITE.findall(sql)} & LEASING_TABLES


# --- the setting and its check --------------------------------------------------------------


def test_read_alias_is_the_default_database_unless_set(leasing_settings):
    assert read_settings({})[0].read_database is None
    assert read_alias() == WRITE_DATABASE == "default"
    leasing_settings(READ_DATABASE=REPLICA)
    assert read_alias() == REPLICA


@pytest.mark.parametrize("value", ["", 3, ["replica"]])
def test_read_database_must_be_an_alias_name(value):
    [problem] = read_settings({"READ_DATABASE": value})[1]
    assert "READ_DATABASE" in problem.message


def test_unknown_read_alias_is_a_system_check_error(settings):
    settings.LEASING = {"READ_DATABASE": "replcia"}
    errors = [m for m in check_settings() if m.id == "leasing.E007"]
    assert len(errors) == 1
    assert errors[0].level == checks.ERROR
    assert "'replcia'" in errors[0].msg and "'default'" in errors[0].msg
    settings.LEASING = {"READ_DATABASE": "default"}
    assert not [m for m in check_settings() if m.id == "leasing.E007"]
    settings.LEASING = {}
    assert not [m for m in check_settings() if m.id == "leasing.E007"]


def test_parse_lsn():
    assert parse_lsn("0/0") == 0
    assert parse_lsn("16/B374D848") == (0x16 << 32) + 0xB374D848
    assert parse_lsn(None) is None
    assert parse_lsn("junk") is None


def test_lag_text_says_what_was_measured():
    assert "not PostgreSQL" in ReplicaLag("r", False, False, None, None, False).text
    assert "not a replica" in ReplicaLag("r", True, False, 0.0, 0, False).text
    text = ReplicaLag("r", True, True, 75.0, 4096, True).text
    assert "1 min 15 s" in text and "4,096 bytes" in text and "replay paused" in text
    assert "unknown" in ReplicaLag("r", True, True, None, None, False).text


# --- the console reads the replica ----------------------------------------------------------


# --- operator actions decide and write on the primary ---------------------------------------
