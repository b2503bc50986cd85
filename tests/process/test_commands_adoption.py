"""What a new site sees from the long-running commands, as real processes: the
default logging of `runworker` and `recoverysweep`, and `recoverysweep --schedule`
without django-q2."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from leasing import LeaseManager, enqueue, enqueue_many
from leasing.models import WorkItem
from tests.support.helpers import ROOT, database_now, site_settings
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)

INFO_LINE = re.compile(r"^\S+ \S+ INFO leasing[.\w]*: ", re.MULTILINE)
DONE_LINE = re.compile(r" leasing\.worker: done \S+ \(test\.noop\) in \d+ ms$", re.MULTILINE)


def run(subprocess_env, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**subprocess_env, **leasing_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def burst(subprocess_env, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = run(subprocess_env, "runworker", "--burst", "--concurrency", "2", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc


def noop_items(n: int) -> None:
    enqueue_many([{"task_id": f"n{i}", "work_type": "test.noop"} for i in range(n)])


# --- runworker ---------------------------------------------------------------------------


def test_runworker_logs_start_stop_summary_retries_and_failures_by_default(subprocess_env):
    noop_items(5)
    enqueue("retried", "test.fail_then_succeed", input_data={"failures": 1}, max_retries=2)
    enqueue("failed", "test.permanent")
    enqueue("slow", "test.sleep", input_data={"seconds": 0.6})
    proc = burst(subprocess_env)
    err = proc.stderr
    assert re.search(r"INFO leasing\.worker: worker \S+ started: concurrency 2", err), err
    assert re.search(r"INFO leasing\.worker: retry scheduled for \S+ \(test\.fail_then", err)
    assert re.search(r"ERROR leasing\.worker: failed \S+ \(test\.permanent\)", err), err
    stopped = r"INFO leasing\.worker: worker \S+ stopped \(burst-done\): claimed 8"
    assert re.search(stopped, err), err
    # The command's own final line stays on stdout.
    assert re.search(r"^worker \S+ stopped", proc.stdout, re.MULTILINE)


def test_runworker_default_verbosity_logs_no_line_per_completed_item(subprocess_env):
    noop_items(20)
    proc = burst(subprocess_env)
    assert "started" in proc.stderr
    assert DONE_LINE.findall(proc.stderr) == []


def test_runworker_v2_logs_one_line_per_completed_item(subprocess_env):
    noop_items(20)
    proc = burst(subprocess_env, "-v", "2")
    assert len(DONE_LINE.findall(proc.stderr)) == 20, proc.stderr
    assert WorkItem.objects.filter(status="completed").count() == 20


def test_runworker_v0_is_quiet_but_still_reports_failures(subprocess_env):
    noop_items(5)
    enqueue("failed", "test.permanent")
    proc = burst(subprocess_env, "-v", "0")
    assert INFO_LINE.findall(proc.stderr) == [], proc.stderr
    assert "ERROR leasing.worker: failed" in proc.stderr
    assert proc.stdout == ""


def test_a_project_that_configures_the_leasing_logger_keeps_control(subprocess_env):
    noop_items(5)
    # project/settings.py configures `leasing` at this level when it is set.
    proc = burst(subprocess_env, "-v", "2", env={"LEASING_LOG_LEVEL": "WARNING"})
    assert INFO_LINE.findall(proc.stderr) == []
    assert "DEBUG" not in proc.stderr
    assert WorkItem.objects.filter(status="completed").count() == 5


# --- recoverysweep ----------------------------------------------------------------------


def expired(task_id: str) -> None:
    item = enqueue(task_id, "test.noop")
    LeaseManager("dead-worker").acquire_lease(task_id_filter=task_id)
    WorkItem.objects.filter(pk=item.pk).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )


def test_recoverysweep_reports_each_pass(subprocess_env):
    expired("lost-1")
    proc = run(subprocess_env, "recoverysweep", "--once")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1  # the pass, as one line
    assert "1 expired" in proc.stdout or "recovered 1" in proc.stdout, proc.stdout
    assert re.search(r"INFO leasing\.sweep: recovery sweep \S+: ", proc.stderr), proc.stderr
    # An empty pass still prints its line.
    again = run(subprocess_env, "recoverysweep", "--once")
    assert len(again.stdout.strip().splitlines()) == 1


def test_recoverysweep_v0_is_quiet(subprocess_env):
    expired("lost-1")
    proc = run(subprocess_env, "recoverysweep", "--once", "-v", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert INFO_LINE.findall(proc.stderr) == []
    assert WorkItem.objects.get(task_id="lost-1").status == "pending"


# --- recoverysweep --schedule without django-q2 ----------------------------------------

WITHOUT_DJANGO_Q = "INSTALLED_APPS = [a for a in INSTALLED_APPS if a != 'django_q']\n"


def schedule(env: dict[str, str], *blocked: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.procs.manage_without",
            ",".join(blocked),
            "recoverysweep",
            "--schedule",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("CommandError: --schedule needs ")
    return lines[0]


def test_schedule_without_django_q2_installed_says_what_to_add(subprocess_env, tmp_path):
    env = site_settings(tmp_path, WITHOUT_DJANGO_Q)
    env["DATABASE_URL"] = subprocess_env["DATABASE_URL"]
    line = one_line_error(schedule(env, "django_q"))
    assert "django-q2, which is not installed" in line
    assert "pip install 'django-leasing[schedule]'" in line
    assert '"django_q" to INSTALLED_APPS' in line


def test_schedule_with_django_q2_not_in_installed_apps(subprocess_env, tmp_path):
    env = site_settings(tmp_path, WITHOUT_DJANGO_Q)
    env["DATABASE_URL"] = subprocess_env["DATABASE_URL"]
    line = one_line_error(schedule(env))
    assert "django_q in INSTALLED_APPS" in line


def test_schedule_with_django_q2_not_migrated(tmp_path: Path):
    database = tmp_path / "site.sqlite3"
    env = site_settings(
        tmp_path,
        "DATABASES = {'default': {**DATABASES['default'], "
        f"'NAME': {str(database)!r}, 'TEST': {{}}}}}}\n",
    )
    env["DATABASE_URL"] = f"sqlite:///{database}"
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "leasing", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrate.returncode == 0, migrate.stderr
    line = one_line_error(schedule(env))
    assert "django-q2's tables, which database 'default' lacks: run manage.py migrate." in line
