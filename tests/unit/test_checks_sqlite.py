"""Safe SQLite or a clear refusal (leasing.E004), and the Tasks backend without the
app installed (leasing.E005)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from leasing.checks import SQLITE_OPTIONS_SNIPPET
from leasing.storage.sqlite import option_problems as sqlite_problems
from tests.support.helpers import ROOT

SAFE = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}


def test_the_recommended_options_pass():
    assert sqlite_problems(SAFE) == []
    # The snippet the hint prints is exactly these options.
    assert eval("{" + SQLITE_OPTIONS_SNIPPET + "}")["OPTIONS"] == SAFE


def test_djangos_default_sqlite_settings_lack_all_three():
    problems = sqlite_problems({})
    assert len(problems) == 3
    assert "IMMEDIATE" in problems[0]
    assert "busy timeout" in problems[1] and "it is 5 s" in problems[1]
    assert "WAL" in problems[2]


@pytest.mark.parametrize(
    ("options", "missing"),
    [
        ({**SAFE, "transaction_mode": "DEFERRED"}, "IMMEDIATE"),
        ({**SAFE, "transaction_mode": None}, "IMMEDIATE"),
        ({**SAFE, "timeout": 5}, "busy timeout"),
        ({**SAFE, "timeout": "30"}, "busy timeout"),
        ({**SAFE, "init_command": "PRAGMA synchronous=NORMAL"}, "WAL"),
        ({**SAFE, "init_command": "PRAGMA journal_mode=DELETE"}, "WAL"),
    ],
)
def test_each_missing_option_is_named(options, missing):
    [problem] = sqlite_problems(options)
    assert missing in problem


def test_a_busy_timeout_pragma_counts_and_spelling_is_free():
    options = {
        "transaction_mode": "immediate",
        "init_command": "pragma JOURNAL_MODE = wal ; PRAGMA busy_timeout = 25000",
    }
    assert sqlite_problems(options) == []


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
