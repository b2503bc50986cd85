"""`manage.py recoverysweep`: one pass, the loop, signals and bad options."""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from leasing import LeaseManager, create_checkpoint, enqueue
from leasing.models import Checkpoint, Worker, WorkItem
from tests.support.helpers import database_now

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


def run(*args: str) -> str:
    out = StringIO()
    call_command("recoverysweep", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


# --- one pass --------------------------------------------------------------------------------


def test_once_json_prints_parseable_stats_and_recovers(db):
    item = expired_item()
    lines = run("--once", "--json").splitlines()

    assert len(lines) == 1
    stats = json.loads(lines[0])
    assert stats["expired_found"] == 1 and stats["recovered"] == 1
    assert stats["failed"] == 0 and stats["errors"] == 0
    assert stats["checkpoints_created"] == 1
    assert isinstance(stats["scan_duration_ms"], float)
    assert stats["scanned_at"] is not None
    row = WorkItem.objects.get(pk=item.pk)
    assert (row.status, row.retry_count) == ("pending", 1)
    [sweeper] = Worker.objects.sweepers()
    assert (sweeper.status, sweeper.scans, sweeper.items_recovered) == ("stopped", 1, 1)


def test_once_prints_a_human_line(db):
    expired_item()
    out = run("--once")
    assert "1 expired: 1 re-queued, 0 failed" in out
    assert "1 checkpoints written" in out


def test_the_settings_reach_the_sweep(db, leasing_settings):
    leasing_settings(CHECKPOINT_RETENTION=2)
    item = expired_item("a")
    for n in range(4):
        create_checkpoint("b", "tool_executed", {"n": n})
    stats = json.loads(run("--once", "--json"))
    assert stats["recovered"] == 1 and stats["checkpoints_created"] == 1
    assert stats["checkpoints_deleted"] == 2
    assert Checkpoint.objects.filter(work_item_id=item.pk).count() == 1


def test_the_once_passes_of_a_host_share_one_workers_row(db):
    run("--once")
    run("--once")
    [sweeper] = Worker.objects.sweepers()
    assert sweeper.worker_id == f"sweeper@{socket.gethostname()}:once"
    assert (sweeper.status, sweeper.scans) == ("stopped", 2)


@pytest.mark.parametrize(
    "args",
    [
        ["--interval", "5"],
        ["--retention", "2"],
        ["--batch-size", "10"],
        ["--no-checkpoints"],
        ["--worker-id", "sw-1"],
        ["--database", "nope"],
        ["--schedule", "--once"],
    ],
)
def test_bad_options_raise_a_command_error_and_change_nothing(db, args):
    expired_item()
    before = state()
    with pytest.raises(CommandError):
        run("--once", *args) if "--schedule" not in args else run(*args)
    assert state() == before


# --- the loop ------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [[], ["--schedule"]])
def test_a_bad_database_names_the_flag_and_the_aliases(db, extra):
    with pytest.raises(CommandError) as info:
        run("--database", "nope", *([] if extra else ["--once"]), *extra)
    assert str(info.value) == (
        "--database must name a database alias of settings.DATABASES ('default'), got 'nope'."
    )
