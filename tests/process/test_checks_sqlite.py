"""Safe SQLite or a clear refusal (leasing.E004), and the Tasks backend without the
app installed (leasing.E005)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from leasing.checks import SQLITE_OPTIONS_SNIPPET
from tests.support.helpers import ROOT, site_settings


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def default_sqlite(tmp_path: Path) -> str:
    # What `django-admin startproject` writes.
    return (
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', "
        f"'NAME': {str(tmp_path / 'db.sqlite3')!r}}}}}\n"
    )


def test_startproject_sqlite_settings_are_a_check_error_with_the_snippet(tmp_path):
    env = site_settings(tmp_path, default_sqlite(tmp_path) + "DEBUG = True\n")
    proc = run(env, "check")
    assert proc.returncode == 1
    assert "(leasing.E004) SQLite database 'default' is not set up for leasing workers" in (
        proc.stderr
    )
    assert f"HINT: Add to DATABASES['default']: {SQLITE_OPTIONS_SNIPPET}" in proc.stderr


def test_runworker_and_recoverysweep_refuse_unsafe_sqlite_in_one_line(tmp_path):
    env = site_settings(tmp_path, default_sqlite(tmp_path))
    for command in (["runworker", "--burst"], ["recoverysweep", "--once"]):
        proc = run(env, *command)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("CommandError: leasing.E004: SQLite database 'default'")


def test_the_readme_sqlite_settings_pass_the_check(tmp_path):
    env = site_settings(
        tmp_path,
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', "
        f"'NAME': {str(tmp_path / 'db.sqlite3')!r}, {SQLITE_OPTIONS_SNIPPET}}}}}\n",
    )
    proc = run(env, "check")
    assert proc.returncode == 0, proc.stderr
    assert "leasing.E004" not in proc.stderr + proc.stdout
    assert "leasing.W001" in proc.stderr + proc.stdout


WITHOUT_LEASING = (
    "INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in "
    "('leasing', 'tests.testapp', 'project.demo')]\n"
    "ROOT_URLCONF = 'site_settings'\n"
    "urlpatterns = []\n"
)


def test_tasks_backend_without_the_app_is_a_check_error(tmp_path):
    env = site_settings(
        tmp_path,
        default_sqlite(tmp_path)
        + WITHOUT_LEASING
        # Whatever defines @task functions imports django.tasks, which registers
        # Django's task checks; this settings module stands in for it.
        + "import django.tasks  # noqa\n",
    )
    proc = run(env, "check")
    assert proc.returncode == 1, proc.stderr
    assert (
        "(leasing.E005) TASKS['default'] uses leasing.tasks.LeasingBackend, but 'leasing' is "
        "not in INSTALLED_APPS" in proc.stderr
    )
    assert "Traceback" not in proc.stderr


def test_tasks_backend_without_the_app_refuses_clearly_at_first_use(tmp_path):
    env = site_settings(
        tmp_path,
        default_sqlite(tmp_path) + WITHOUT_LEASING,
    )
    code = (
        "import django; django.setup()\n"
        "from django.core.exceptions import ImproperlyConfigured\n"
        "from django.tasks import task\n"
        "@task\n"
        "def ping(): return 1\n"
        "try:\n"
        "    ping.enqueue()\n"
        "except ImproperlyConfigured as exc:\n"
        "    print('refused:', exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("refused: TASKS['default'] uses leasing.tasks.LeasingBackend")


def test_a_listen_database_that_cannot_listen_is_a_check_error(tmp_path):
    """Workers on PostgreSQL listen through LISTEN_DATABASE: a SQLite alias failed every
    second, said only at DEBUG, and idle workers fell back to polling. (The check reads
    the settings alone: nothing connects.)"""
    lite = f"{{'ENGINE': 'django.db.backends.sqlite3', 'NAME': {str(tmp_path / 'l.db')!r}}}"
    postgres = "{'ENGINE': 'django.db.backends.postgresql', 'NAME': 'app', 'HOST': '127.0.0.1'}"
    env = site_settings(
        tmp_path,
        f"DATABASES = {{'default': {postgres}, 'lite': {lite}, 'direct': {postgres}}}\n"
        "LEASING = {**LEASING, 'LISTEN_DATABASE': 'lite'}\n",
    )
    proc = run(env, "check")
    assert proc.returncode == 1
    assert "(leasing.E009) LEASING['LISTEN_DATABASE'] is 'lite', whose database cannot LISTEN" in (
        proc.stderr
    )
    env = site_settings(
        tmp_path,
        f"DATABASES = {{'default': {postgres}, 'direct': {postgres}}}\n"
        "LEASING = {**LEASING, 'LISTEN_DATABASE': 'direct'}\n",
    )
    proc = run(env, "check")
    assert "leasing.E009" not in proc.stderr, proc.stderr
