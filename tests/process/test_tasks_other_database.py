"""A Tasks backend whose OPTIONS['DATABASE'] names another alias, run by real processes.

Before, `manage.py check` said nothing, `Task.enqueue()` wrote to that alias, and
`runworker` (no --database) claimed nothing there: the result stayed READY forever.
Now `manage.py check` warns (leasing.W011) and `runworker --burst --database ALIAS` runs
the task. The subprocesses' settings are tests/support/other_database_settings.py: the
test database is their "other", and their "default" a migrated SQLite file of the test's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from leasing.models import Worker, WorkItem
from tests.support.helpers import ROOT
from tests.support.workers import leasing_env, parse_summary

pytestmark = pytest.mark.django_db(transaction=True)

ENQUEUE = """
import django
django.setup()
from tests.testapp import tasks
print(tasks.add.using(backend="elsewhere").enqueue(1, 2).id)
"""

RESULT = """
import sys, django
django.setup()
from tests.testapp import tasks
result = tasks.add.using(backend="elsewhere").get_result(sys.argv[1])
print(result.status, result.return_value)
"""


@pytest.fixture
def other_env(subprocess_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    env = {
        **subprocess_env,
        **leasing_env(),
        "DJANGO_SETTINGS_MODULE": "tests.support.other_database_settings",
        "LEASING_TEST_DEFAULT_URL": f"sqlite:///{tmp_path / 'default.sqlite3'}",
    }
    run(env, "manage.py", "migrate", "-v", "0")
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def runworker(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = run(env, "manage.py", "runworker", "--burst", *args)
    return parse_summary(proc.stdout)


def test_runworker_database_runs_the_tasks_a_backend_enqueues_to_that_alias(other_env):
    check = run(other_env, "manage.py", "check")
    assert (
        "(leasing.W011) TASKS['elsewhere'] enqueues to database 'other', not the default: "
        "its tasks run only under `runworker --database other`"
    ) in check.stderr + check.stdout

    result_id = run(other_env, "-c", ENQUEUE).stdout.strip()
    item = WorkItem.objects.get(pk=result_id)  # the test database: the subprocesses' "other"
    assert (item.status, item.input_data["backend"]) == ("pending", "elsewhere")

    # A worker of the default alias does not see it (what the check warns about).
    assert runworker(other_env)["claimed"] == 0
    assert WorkItem.objects.get(pk=result_id).status == "pending"

    summary = runworker(other_env, "--database", "other")  # was: unrecognized arguments
    assert (summary["claimed"], summary["completed"]) == (1, 1)
    item = WorkItem.objects.get(pk=result_id)
    assert (item.status, item.output_data["return_value"]) == ("completed", 3)
    # The worker registered in the database it served.
    assert Worker.objects.filter(worker_id=summary["worker_id"], status="stopped").exists()
    assert run(other_env, "-c", RESULT, result_id).stdout.split() == ["SUCCESSFUL", "3"]


def test_an_unknown_database_exits_non_zero_with_one_line(spawn):
    proc = spawn("manage.py", "runworker", "--burst", "--database", "nope")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err == (
        "CommandError: --database must name a database alias of settings.DATABASES "
        "('default'), got 'nope'.\n"
    )
    assert out == ""
    assert not Worker.objects.exists()
