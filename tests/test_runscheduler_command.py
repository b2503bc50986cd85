"""`manage.py runscheduler`: one pass, the loop and its signals, bad options and bad settings."""

from __future__ import annotations

import json
import signal
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from leasing.models import Schedule, WorkItem
from leasing.services.schedules import save_schedule
from leasing.sql.runner import database_now
from leasing.ticks import parse_schedule
from tests.test_recoverysweep_command import _lines

pytestmark = pytest.mark.django_db

BEAT = {"beat": {"work_type": "test.noop", "every": 3600, "payload": {"n": 1}}}


def run(*args: str) -> str:
    out = StringIO()
    call_command("runscheduler", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_once_syncs_the_settings_and_enqueues_what_is_due(leasing_settings):
    leasing_settings(SCHEDULES=BEAT)
    assert run("--once", "--json") == ""  # synced; its first tick is up to an hour away
    row = Schedule.objects.get()
    assert row.from_settings
    Schedule.objects.update(next_run_at=database_now() - timedelta(seconds=1))
    [line] = run("--once", "--json").splitlines()
    fired = json.loads(line)
    assert fired["schedule"] == "beat" and not fired["duplicate"]
    item = WorkItem.objects.get()
    assert item.work_item_id == fired["work_item_id"]
    assert item.input_data["n"] == 1


def test_no_sync_leaves_the_table_alone(leasing_settings):
    leasing_settings(SCHEDULES=BEAT)
    run("--once", "--no-sync")
    assert not Schedule.objects.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--interval", "0"], "--interval"),
        (["--interval", "-3"], "--interval"),
        (["--interval", "soon"], "--interval"),
        (["--database", "nope"], "'nope' is not in settings.DATABASES"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_options_raise_one_command_error_and_write_nothing(leasing_settings, args, needle):
    leasing_settings(SCHEDULES=BEAT)
    with pytest.raises(CommandError) as info:
        run("--once", *args)
    assert needle in str(info.value)
    assert len(str(info.value).splitlines()) == 1
    assert not Schedule.objects.exists()


def test_bad_schedules_in_the_settings_stop_the_command_with_the_check(leasing_settings):
    leasing_settings(SCHEDULES={"nightly": {"work_type": "x", "cron": "0 25 * * *"}})
    with pytest.raises(CommandError) as info:
        run("--once")
    message = str(info.value)
    assert message.startswith("leasing.E006:") and "'nightly': invalid cron" in message
    assert len(message.splitlines()) == 1
    assert not Schedule.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--interval", "0"], "--interval"), (["--database", "nope"], "--database 'nope'")],
)
def test_bad_options_exit_non_zero_with_one_line(spawn, args, needle):
    proc = spawn("manage.py", "runscheduler", *args)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert out == ""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_loop_enqueues_ticks_and_stops_cleanly_on_a_signal(spawn, signum):
    save_schedule(parse_schedule("fast", {"work_type": "test.noop", "every": 1}))
    proc = spawn("manage.py", "runscheduler", "--interval", "0.2", "--json")
    stdout = _lines(proc.stdout)
    first = json.loads(stdout.get(timeout=30))
    second = json.loads(stdout.get(timeout=10))  # it loops: the next second's tick
    assert first["schedule"] == second["schedule"] == "fast"
    assert second["tick"] > first["tick"]
    started = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout=15)
    assert proc.returncode == 0, proc.stderr.read()
    assert time.monotonic() - started < 5
    ticks = WorkItem.objects.values_list("task_id", flat=True)
    assert len(ticks) == len(set(ticks)) >= 2
