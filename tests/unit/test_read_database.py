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

import sqlite3
from typing import Any

import pytest
from django.core import checks
from django.db import DatabaseError, OperationalError, ProgrammingError, connections
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper

from leasing.checks import check_settings
from leasing.conf import WRITE_DATABASE, read_alias, read_settings
from leasing.console.replica import ReplicaLag, parse_lsn
from leasing.console.unreachable import Unreachable, unreachable
from leasing.exceptions import DatabaseUnavailable

REPLICA = "replica"
# A SQLite file in a directory that does not exist: a database that never opens.
UNOPENABLE = "/nonexistent/leasing-read-database/x.sqlite3"


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


# --- a read database that does not answer ----------------------------------------------------


def refused(alias: str, django_db_blocker: Any) -> DatabaseError:
    """What Django raises when the connection of `alias` cannot be opened."""
    settings_dict = {**connections["default"].settings_dict, "NAME": UNOPENABLE, "OPTIONS": {}}
    wrapper = SQLiteWrapper({**settings_dict, "ENGINE": "django.db.backends.sqlite3"}, alias)
    with django_db_blocker.unblock(), pytest.raises(DatabaseError) as caught:
        wrapper.ensure_connection()
    return caught.value


def test_an_outage_names_the_database_that_did_not_answer(leasing_settings, django_db_blocker):
    leasing_settings(READ_DATABASE=REPLICA)
    reason = "OperationalError: unable to open database file"
    outage = unreachable(refused(REPLICA, django_db_blocker))
    assert outage == Unreachable(REPLICA, reason, read_database=True)
    assert outage.text.startswith(f"The read database 'replica' (LEASING['READ_DATABASE']) is "
                                  f"unreachable: {reason}.")  # fmt: skip
    assert "remove READ_DATABASE" in outage.text and "\n" not in outage.text
    # The primary failing while the console reads a replica is not the replica's fault.
    primary = unreachable(refused("default", django_db_blocker))
    assert primary == Unreachable("default", reason, read_database=False)
    assert "READ_DATABASE" not in primary.text
    # As `leasing.sql.runner` raises it: the reason is the driver's, not the wrapper's.
    cause = refused(REPLICA, django_db_blocker)
    try:
        raise DatabaseUnavailable(f"Database unavailable: {cause}") from cause
    except DatabaseUnavailable as exc:
        assert unreachable(exc) == outage


@pytest.mark.parametrize(
    "error",
    [
        OperationalError("database is locked"),  # a lock conflict: run it again, no outage
        OperationalError("no such table: work_items"),  # a schema problem: a real error
        ProgrammingError("syntax error"),
    ],
)
def test_errors_that_are_no_outage_stay_errors(error):
    try:
        raise error from sqlite3.OperationalError(str(error))
    except DatabaseError as exc:
        assert unreachable(exc) is None
