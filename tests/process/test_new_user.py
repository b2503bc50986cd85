"""The new-user test (scripts/new_user.py): the wheel in a fresh virtualenv and a
fresh `startproject` site set up as README.md says; 400 items, two burst workers,
a sweep pass, the dashboard and /metrics. Once per database pass of `make test`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.helpers import ROOT, database_url

pytestmark = pytest.mark.long

SCRIPT = ROOT / "scripts" / "new_user.py"


def drive(*args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.rstrip().endswith("] passed"), proc.stdout


def test_a_new_sqlite_site_runs_400_items(vendor):
    if vendor != "sqlite":
        pytest.skip("the SQLite site runs in the SQLite pass of make test")
    drive("sqlite")


@pytest.mark.postgres
def test_a_new_postgres_site_runs_400_items(db):
    # The site gets its own database beside the test database, on the same server.
    drive("postgres", "--database-url", database_url())
