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

import logging
from collections import Counter
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from leasing import LeaseManager, enqueue_many
from leasing.conf import get_settings
from leasing.models import Schedule, WorkItem
from leasing.services import schedules as service
from leasing.ticks import parse_schedule
from leasing.worker import WorkerOptions, WorkerRuntime
from tests.support.helpers import database_now

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


def fair_backlog(key: str, n: int) -> None:
    enqueue_many(
        [
            {"task_id": f"{key}-{i}", "work_type": "t", "queue_name": "q", "fairness_key": key}
            for i in range(n)
        ]
    )


@pytest.mark.django_db
def test_the_largest_limits_and_weight_the_check_accepts_work_in_a_claim(leasing_settings):
    """The bounds are what the claim's SQL holds: at each one a claim still works (a
    weight of 10**20 or a limit of 2**63 used to fail every claim, on PostgreSQL or SQLite)."""
    leasing_settings(
        QUEUE_LIMITS={"q": 2**31 - 1},
        WORK_TYPE_LIMITS={"t": 2**31 - 1},
        FAIR_QUEUES=["q"],
        FAIRNESS_WEIGHTS={"gold": 1_000_000},
    )
    fair_backlog("gold", 3)
    fair_backlog("silver", 3)
    leases = LeaseManager("w1").acquire_leases(4)
    assert len(leases) == 4


@pytest.mark.django_db
def test_recoverysweep_schedule_refuses_a_sweep_interval_django_q_cannot_repeat(leasing_settings):
    """It used to end in a ValidationError traceback on PostgreSQL (Schedule.minutes is a
    small integer); refused on every database now, before the schedule is written."""
    pytest.importorskip("django_q")
    leasing_settings(SWEEP_INTERVAL=1_966_021)
    with pytest.raises(CommandError) as info:
        call_command("recoverysweep", "--schedule", stdout=StringIO(), stderr=StringIO())
    assert "at most 32767 minutes" in str(info.value)
    assert len(str(info.value).splitlines()) == 1


# --- run time: limits ---------------------------------------------------------------------


def by_queue(leases: list[Any]) -> Counter:
    return Counter(lease.queue_name for lease in leases)


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


BAD_LIMITS = {"q\x00": 1, "q\ud800": 1}


@pytest.mark.django_db
def test_a_bad_limit_is_logged_once_and_skipped_and_the_good_one_still_applies(
    leasing_settings, caplog
):
    leasing_settings(QUEUE_LIMITS={**BAD_LIMITS, "lim": 3}, WORK_TYPE_LIMITS={"t\x00": 1})
    enqueue(10, "lim", priority=5)
    enqueue(10, "free")
    with caplog.at_level(logging.ERROR, logger="leasing"):
        first = LeaseManager("w1").acquire_leases(10)
        second = LeaseManager("w2").acquire_leases(10)
    assert by_queue(first) == {"lim": 3, "free": 7}  # the good limit holds
    assert by_queue(second) == {"free": 3}
    skipped = [r.getMessage() for r in caplog.records if "Skipped" in r.getMessage()]
    assert len(skipped) == 3  # one line per bad entry, not one per claim
    assert get_settings().queue_limits == {"lim": 3}


@pytest.mark.django_db(transaction=True)
def test_a_worker_with_a_bad_limit_among_good_ones_completes_the_other_queues(leasing_settings):
    """It used to raise at its first claim and exit: every queue stopped, not just one."""
    leasing_settings(QUEUE_LIMITS={**BAD_LIMITS, "lim": 2})
    enqueue(6, "lim", work_type="test.echo")
    enqueue(6, "free", work_type="test.echo")
    runtime = WorkerRuntime(
        WorkerOptions(burst=True, work_types=("test.echo",), concurrency=3, poll_interval=0.05)
    )
    summary = runtime.run()
    assert summary.reason == "burst-done"
    assert summary.completed == 12
    assert WorkItem.objects.exclude(status="completed").count() == 0


@pytest.mark.django_db(transaction=True)
def test_runworker_runs_the_check_and_refuses_a_bad_limit_in_one_line(leasing_settings):
    leasing_settings(QUEUE_LIMITS={"q\x00": 1, "lim": 2})
    enqueue(2, "free", work_type="test.echo")
    with pytest.raises(CommandError) as info:
        call_command("runworker", "--burst", stdout=StringIO(), stderr=StringIO())
    text = str(info.value)
    assert text.startswith("leasing.E001: LEASING['QUEUE_LIMITS'] key 'q\\x00'")
    assert len(text.splitlines()) == 1
    assert WorkItem.objects.filter(status="pending").count() == 2


# --- run time: schedules ------------------------------------------------------------------


def run_scheduler(*args: str) -> str:
    out = StringIO()
    call_command("runscheduler", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_a_bad_schedule_is_logged_once_and_skipped_and_the_good_ones_tick(leasing_settings, caplog):
    leasing_settings(
        SCHEDULES={
            "bad": {**GOOD, "payload": {"a": "\x00"}},
            "n\ud800": GOOD,
            "good": {**GOOD, "payload": {"n": 1}},
        }
    )
    with caplog.at_level(logging.ERROR, logger="leasing"):
        service.sync_from_settings()
        Schedule.objects.update(next_run_at=database_now() - timedelta(seconds=1))
        fired = service.run_due()
        service.run_due()
    assert list(Schedule.objects.values_list("name", flat=True)) == ["good"]
    assert [f.schedule for f in fired] == ["good"]
    assert WorkItem.objects.get().input_data["n"] == 1
    skipped = [r.getMessage() for r in caplog.records if "Skipped" in r.getMessage()]
    assert len(skipped) == 2 and "'bad'" in skipped[0] and "NUL" in skipped[0]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "definition",
    [
        {**GOOD, "payload": {"a": "\x00"}},
        {**GOOD, "payload": {"a": "\ud800"}},
        {**GOOD, "payload": {"a": "x" * (MIB - 20)}},
        {**GOOD, "queue": "q\x00"},
        {**GOOD, "payload": {"a": nested(101)}},
    ],
    ids=["nul", "surrogate", "too-large-with-its-tick", "nul-in-queue", "too-deep"],
)
def test_runscheduler_refuses_a_bad_schedule_at_start_in_one_line(leasing_settings, definition):
    """It used to start, then die with a traceback, blame the database or refuse every tick."""
    leasing_settings(SCHEDULES={"nightly": definition, "good": GOOD})
    with pytest.raises(CommandError) as info:
        run_scheduler("--once")
    text = str(info.value)
    assert text.startswith("leasing.E006: LEASING['SCHEDULES']: schedule 'nightly': ")
    assert len(text.splitlines()) == 1
    assert not Schedule.objects.exists()


def admin_schedule(name: str, **definition: Any) -> int:
    return service.save_schedule(parse_schedule(name, {**GOOD, **definition}))


@pytest.mark.django_db
def test_a_row_that_fails_at_its_tick_is_logged_once_per_scheduler_and_the_others_tick(
    leasing_settings, caplog
):
    admin_schedule("by-hand")
    admin_schedule("outgrown", payload={"blob": "x" * 600})
    admin_schedule("good", payload={"n": 1})
    # A payload written by hand that is not an object, and a limit lowered under a payload.
    Schedule.objects.filter(name="by-hand").update(payload=[1, 2])
    leasing_settings(MAX_PAYLOAD_BYTES=500)
    Schedule.objects.update(next_run_at=database_now() - timedelta(seconds=1))
    reported: set[tuple[str, str]] = set()
    with caplog.at_level(logging.DEBUG, logger="leasing"):
        first = service.run_due(reported=reported)
        second = service.run_due(reported=reported)
    assert [f.schedule for f in first] == ["good"] and second == []
    errors_logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors_logged) == 2
    assert any("schedule by-hand cannot enqueue its tick" in m for m in errors_logged)
    assert any("schedule outgrown" in m and "over the limit" in m for m in errors_logged)
    repeats = [r for r in caplog.records if "still cannot enqueue" in r.getMessage()]
    assert len(repeats) == 2
    # Both are retried each pass: their next tick was not moved.
    assert Schedule.objects.filter(next_run_at__lte=database_now()).count() == 2
