"""`manage.py runscheduler`: one pass, the loop and its signals, bad options and bad settings."""

from __future__ import annotations

import re
import signal
import time

import pytest

from leasing.models import WorkItem
from leasing.services.schedules import save_schedule
from leasing.ticks import parse_schedule
from tests.support.helpers import pipe_lines

pytestmark = pytest.mark.django_db


def fired(line: str) -> tuple[str, str, str]:
    """A line of the output: `schedule tick -> work item id`, and what it stands for
    when ticks were missed (a slow start on a busy host coalesces them)."""
    match = re.fullmatch(r"(\S+) (\S+) -> (\S+)(?: \(stands for \d+ ticks\))?", line)
    assert match, line
    return match[1], match[2], match[3]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--interval", "0"], "--interval was removed"),
        (["--database", "other"], "--database was removed"),
    ],
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
    proc = spawn("manage.py", "runscheduler")
    stdout = pipe_lines(proc.stdout)
    first = fired(stdout.get(timeout=30).strip())
    second = fired(stdout.get(timeout=10).strip())  # it loops: the next second's tick
    assert first[0] == second[0] == "fast"
    assert second[1] > first[1]
    started = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout=15)
    assert proc.returncode == 0, proc.stderr.read()
    assert time.monotonic() - started < 5
    ticks = WorkItem.objects.values_list("task_id", flat=True)
    assert len(ticks) == len(set(ticks)) >= 2
