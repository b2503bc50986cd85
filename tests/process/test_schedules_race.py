"""Several schedulers, one item per tick: three real scheduler processes on
PostgreSQL race through 60 one-second ticks, their clocks moved by time-machine
in lock-step (tests/procs/scheduler_ticks.py)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from leasing.models import Schedule, WorkItem
from leasing.services.schedules import unique_key

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PROCESSES = 3
TICKS = 60
START = datetime(2030, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC)


def read_json(proc) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return json.loads(line)


def test_three_schedulers_enqueue_exactly_one_item_per_tick(spawn):
    procs = [
        spawn("-m", "tests.procs.scheduler_ticks", START.isoformat(), "race", stdin=-1)
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        assert read_json(proc) == {"ready": True}
    assert Schedule.objects.count() == 1  # three concurrent syncs, one row

    fired_by: Counter[int] = Counter()
    ticks_fired: Counter[str] = Counter()
    for n in range(1, TICKS + 1):
        # Every process gets the tick before any answers: they race on it.
        for proc in procs:
            proc.stdin.write(f"{n}\n")
            proc.stdin.flush()
        for index, proc in enumerate(procs):
            answer = read_json(proc)
            assert answer["n"] == n
            for tick, _item, duplicate in answer["fired"]:
                assert not duplicate  # the compare-and-swap alone kept the others out
                ticks_fired[tick] += 1
                fired_by[index] += 1
    for proc in procs:
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()

    expected = [START.replace(microsecond=0) + timedelta(seconds=n) for n in range(1, TICKS + 1)]
    assert sorted(ticks_fired) == [t.isoformat() for t in expected]
    assert set(ticks_fired.values()) == {1}
    items = WorkItem.objects.filter(work_type="test.noop")
    assert items.count() == TICKS
    assert sorted(items.values_list("task_id", flat=True)) == sorted(
        unique_key("race", t) for t in expected
    )
    row = Schedule.objects.get()
    assert row.last_tick_at == expected[-1]
    assert row.next_run_at == expected[-1] + timedelta(seconds=1)
    print(f"ticks won per process: {dict(fired_by)}")
