"""The app without its extras: psycopg, django-q2, prometheus-client and
dj-database-url are optional, so nothing may import them when the app loads."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.helpers import ROOT


def test_every_module_imports_and_checks_run_without_the_extras(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.procs.without_extras", str(tmp_path / "db.sqlite3")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["errors"] == []
    assert {"leasing.worker", "leasing.sweep", "leasing.metrics", "leasing.tasks"} <= set(
        report["imported"]
    )
    # Safe SQLite options, so no leasing error; only the production warning.
    assert [i for i in report["check_ids"] if i.startswith("leasing.")] == ["leasing.W001"]
    assert "pip install 'django-leasing[metrics]'" in report["metrics"]
