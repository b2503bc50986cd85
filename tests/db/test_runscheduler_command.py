"""`manage.py runscheduler`: one pass, the loop and its signals, bad options and bad settings."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from leasing.models import Schedule, WorkItem
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db

BEAT = {"beat": {"work_type": "test.noop", "every": 3600, "payload": {"n": 1}}}


def run(*args: str) -> str:
    out = StringIO()
    call_command("runscheduler", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def fired(line: str) -> tuple[str, str, str]:
    """A line of the output: `schedule tick -> work item id`."""
    match = re.fullmatch(r"(\S+) (\S+) -> (\S+)", line)
    assert match, line
    return match[1], match[2], match[3]


def test_once_syncs_the_settings_and_enqueues_what_is_due(leasing_settings):
    leasing_settings(SCHEDULES=BEAT)
    assert run("--once") == ""  # synced; its first tick is up to an hour away
    row = Schedule.objects.get()
    assert row.from_settings
    Schedule.objects.update(next_run_at=database_now() - timedelta(seconds=1))
    [line] = run("--once").splitlines()
    schedule, _tick, work_item_id = fired(line)
    assert schedule == "beat"
    item = WorkItem.objects.get()
    assert item.work_item_id == work_item_id
    assert item.input_data["n"] == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--interval", "5"], "--interval was removed: the scheduler makes a pass every 1s"),
        (["--no-sync"], "--no-sync was removed"),
        (["--json"], "--json was removed"),
        (["--database", "other"], "--database was removed: the scheduler uses the default"),
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


def test_an_outage_mid_pass_still_prints_the_items_the_pass_enqueued(leasing_settings, monkeypatch):
    from leasing.exceptions import DatabaseUnavailable
    from leasing.services import schedules as service

    leasing_settings(
        SCHEDULES={
            "first": {"work_type": "test.noop", "every": 3600},
            "second": {"work_type": "test.echo", "every": 3600},
        }
    )
    run("--once")  # synced; both first tick up to an hour away
    now = database_now()
    Schedule.objects.filter(name="first").update(next_run_at=now - timedelta(seconds=2))
    Schedule.objects.filter(name="second").update(next_run_at=now - timedelta(seconds=1))
    real_enqueue = service.enqueue

    def database_gone_for_the_second(task_id, work_type, *args, **kwargs):
        if work_type == "test.echo":
            raise DatabaseUnavailable("Database unavailable: server closed the connection")
        return real_enqueue(task_id, work_type, *args, **kwargs)

    monkeypatch.setattr(service, "enqueue", database_gone_for_the_second)
    out = StringIO()
    with pytest.raises(CommandError, match="server closed the connection"):
        call_command("runscheduler", "--once", stdout=out, stderr=StringIO())
    # The item of the first schedule exists: its line is in the output.
    [line] = out.getvalue().splitlines()
    schedule, _tick, work_item_id = fired(line)
    assert schedule == "first"
    assert WorkItem.objects.get().work_item_id == work_item_id
