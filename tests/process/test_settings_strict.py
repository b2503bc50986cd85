"""Settings checked as strictly as they are used (issue 39): "a setting that manage.py
check accepts never stops work at run time".

* `manage.py check` applies the runtime's rules to every LEASING entry (storable
  text, sizes, depths, the ranges the runtime takes, known database aliases),
  one error per bad entry: a QUEUE_LIMITS name with a NUL used to pass the check
  and then stop every worker at its first claim; a schedule with a NUL in its
  payload used to pass and then fail at every tick.
* At run time (a process that did not run the check) a bad limit or schedule
  costs only itself: logged once, skipped; the other limits, schedules, the
  worker and the scheduler go on. A commanded process (runworker,
  runscheduler) runs the check first and refuses to start in one line.
* The scheduler isolates a row of its table that fails at its tick (written by
  hand, or outgrown by a lowered MAX_PAYLOAD_BYTES): the other schedules tick,
  the row is logged once per scheduler, not once a pass.
"""

from __future__ import annotations

import signal
from datetime import timedelta
from typing import Any

import pytest

from leasing import enqueue_many
from leasing.models import Schedule
from leasing.services import schedules as service
from leasing.ticks import parse_schedule
from tests.support.helpers import database_now, pipe_lines

MIB = 1024 * 1024
GOOD = {"work_type": "test.noop", "every": 3600}


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


# --- the check: limits --------------------------------------------------------------------


# --- the check: schedules -----------------------------------------------------------------

LONG_CRON = " ".join(
    [
        ",".join(map(str, range(60))),
        ",".join(map(str, range(24))),
        ",".join(map(str, range(1, 32))),
        "*",
        "*",
    ]
)


# --- the check: the other settings --------------------------------------------------------


# --- run time: limits ---------------------------------------------------------------------


def enqueue(n: int, queue: str, work_type: str = "test.noop", priority: int = 0) -> None:
    enqueue_many(
        [
            {
                "task_id": f"{queue}-{i}",
                "work_type": work_type,
                "queue_name": queue,
                "priority": priority,
            }
            for i in range(n)
        ]
    )


# --- run time: schedules ------------------------------------------------------------------


def admin_schedule(name: str, **definition: Any) -> int:
    return service.save_schedule(parse_schedule(name, {**GOOD, **definition}))


@pytest.mark.django_db(transaction=True)
def test_a_running_scheduler_keeps_ticking_beside_a_row_that_fails(spawn):
    """A row that raised anything but InvalidInput used to end the loop with a traceback."""
    admin_schedule("by-hand")
    admin_schedule("fast", every=1)
    Schedule.objects.filter(name="by-hand").update(
        payload=[1, 2], next_run_at=database_now() - timedelta(seconds=1)
    )
    proc = spawn("manage.py", "runscheduler")
    stdout = pipe_lines(proc.stdout)
    ticks = [stdout.get(timeout=30) for _ in range(3)]  # "schedule tick -> item id"
    assert {t.split()[0] for t in ticks} == {"fast"}
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)
    stderr = proc.stderr.read()
    assert proc.returncode == 0, stderr
    failures = [line for line in stderr.splitlines() if "by-hand cannot enqueue" in line]
    assert len(failures) == 1, stderr  # once, not once a pass
    assert "TypeError" in failures[0]
