"""The app without its extras: psycopg, django-q2, prometheus-client and
dj-database-url are optional, so nothing may import them when the app loads."""

from __future__ import annotations

import tomllib

from tests.support.helpers import ROOT


def test_hard_dependencies_are_only_django():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == ["Django>=6.0,<6.2"]
    extras = project["optional-dependencies"]
    assert extras["postgres"][0].startswith("psycopg")
    assert extras["schedule"][0].startswith("django-q2")
    assert extras["metrics"][0].startswith("prometheus-client")
