"""The app without its extras: psycopg, django-q2, prometheus-client and
dj-database-url are optional, so nothing may import them when the app loads."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest
from django.test import Client

from tests.conftest import ROOT
from tests.test_admin_support import VIEW_ALL, make_user


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


def test_hard_dependencies_are_only_django():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == ["Django>=6.0,<6.2"]
    extras = project["optional-dependencies"]
    assert extras["postgres"][0].startswith("psycopg")
    assert extras["schedule"][0].startswith("django-q2")
    assert extras["metrics"][0].startswith("prometheus-client")


@pytest.mark.django_db
def test_metrics_answer_503_naming_the_extra_when_prometheus_client_is_missing(monkeypatch):
    staff = Client()
    staff.force_login(make_user("ops", *VIEW_ALL))
    assert staff.get("/metrics").status_code == 200
    # A None entry makes `import prometheus_client...` raise ImportError.
    for name in ("prometheus_client", "prometheus_client.core"):
        monkeypatch.setitem(sys.modules, name, None)
    response = staff.get("/metrics")
    assert response.status_code == 503
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert b"pip install 'django-leasing[metrics]'" in response.content
    # Access is still checked first: an anonymous caller learns nothing.
    anonymous = Client().get("/metrics")
    assert anonymous.status_code == 302
