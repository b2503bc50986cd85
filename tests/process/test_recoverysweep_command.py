"""`manage.py recoverysweep`: one pass, the loop, signals and bad options."""

from __future__ import annotations

import json
import signal
import time
from datetime import timedelta
from typing import Any

import pytest

from leasing import LeaseManager, enqueue
from leasing.models import Checkpoint, Worker, WorkItem
from tests.support.helpers import database_now, pipe_lines
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db


def expired_item(task_id: str = "t") -> WorkItem:
    item = enqueue(task_id, "noop")
    LeaseManager("dead-worker").acquire_lease(task_id_filter=task_id)
    WorkItem.objects.filter(pk=item.pk).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )
    return item


def state() -> tuple[list[dict[str, Any]], int, int]:
    return (
        list(WorkItem.objects.order_by("pk").values()),
        Checkpoint.objects.count(),
        Worker.objects.count(),
    )


# --- one pass --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--interval", "0"], "--interval was removed: set LEASING['SWEEP_INTERVAL']"),
        (["--retention", "-1"], "--retention was removed: set LEASING['CHECKPOINT_RETENTION']"),
        (["--schedule", "--once"], "--schedule"),
    ],
)
def test_bad_options_exit_non_zero_with_one_line(db, spawn, args, needle):
    expired_item()
    before = state()
    proc = spawn("manage.py", "recoverysweep", *args)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert out == ""
    assert state() == before


# --- the loop ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_loop_stops_cleanly_on_a_signal(db, spawn, signum):
    item = expired_item()
    proc = spawn("manage.py", "recoverysweep", "--json", env=leasing_env(SWEEP_INTERVAL=0.2))
    stdout = pipe_lines(proc.stdout)
    first = json.loads(stdout.get(timeout=30))  # running, handlers installed
    assert first["recovered"] == 1
    second = json.loads(stdout.get(timeout=10))  # it loops
    assert second["expired_found"] == 0
    [sweeper] = Worker.objects.sweepers()
    assert sweeper.status == "running"

    started = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout=15)
    assert proc.returncode == 0, proc.stderr.read()
    assert time.monotonic() - started < 5
    sweeper.refresh_from_db()
    assert sweeper.status == "stopped" and sweeper.stopped_at is not None
    assert sweeper.scans >= 2 and sweeper.items_recovered == 1
    assert WorkItem.objects.get(pk=item.pk).status == "pending"
