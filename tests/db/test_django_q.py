"""The sweep as a django-q2 scheduled task."""

from __future__ import annotations

import ast
import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django_q.conf import Conf
from django_q.models import Schedule, Task
from django_q.tasks import async_task, result

from leasing import LeaseManager, enqueue
from leasing.models import Checkpoint, Worker, WorkItem
from leasing.sweep.schedule import (
    SCHEDULE_NAME,
    SCHEDULED_SWEEPER_ID,
    run_sweep_pass,
    schedule_sweep,
)
from tests.support.helpers import database_now


def expired_item(task_id: str) -> WorkItem:
    item = enqueue(task_id, "noop")
    LeaseManager("dead-worker").acquire_lease(task_id_filter=task_id)
    WorkItem.objects.filter(pk=item.pk).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )
    return item


@pytest.fixture
def sync_q(settings, monkeypatch):
    """django-q2 in sync mode: async_task() runs the task here and now."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": True}
    # django_q.conf.Conf read Q_CLUSTER when it was imported.
    monkeypatch.setattr(Conf, "SYNC", True)


@pytest.mark.django_db(transaction=True)
def test_run_sweep_pass_returns_json_able_stats_and_shares_one_row(db):
    first_item = expired_item("a")
    stats = run_sweep_pass()
    assert json.loads(json.dumps(stats)) == stats
    assert stats["worker_id"] == SCHEDULED_SWEEPER_ID
    assert (stats["expired_found"], stats["recovered"]) == (1, 1)
    assert WorkItem.objects.get(pk=first_item.pk).status == "pending"

    expired_item("b")
    assert run_sweep_pass()["recovered"] == 1
    [row] = Worker.objects.sweepers()
    assert row.worker_id == SCHEDULED_SWEEPER_ID
    assert (row.status, row.scans, row.items_recovered) == ("stopped", 2, 2)
    assert row.last_scan_at is not None
    # A row deleted between passes (say, by a cleanup script) comes back.
    row.delete()
    run_sweep_pass()
    assert Worker.objects.get(pk=SCHEDULED_SWEEPER_ID).scans == 1


@pytest.mark.django_db(transaction=True)
def test_async_task_runs_a_pass_in_sync_mode(db, sync_q):
    item = expired_item("a")
    task_id = async_task("leasing.sweep.schedule.run_sweep_pass", interval=60.0)

    stats = result(task_id)
    assert stats["recovered"] == 1 and stats["errors"] == 0
    assert Task.objects.get(id=task_id).success is True
    row = WorkItem.objects.get(pk=item.pk)
    assert (row.status, row.error_message) == ("pending", "Lease expired - retry 1/3")
    assert Checkpoint.objects.filter(work_item_id=item.pk).count() == 1


@pytest.mark.django_db(transaction=True)
def test_schedule_is_created_once_and_its_task_runs(db, sync_q, leasing_settings):
    leasing_settings(SWEEP_INTERVAL=90)
    out = StringIO()
    call_command("recoverysweep", "--schedule", stdout=out)
    assert "Created" in out.getvalue()
    leasing_settings(CHECKPOINT_RETENTION=7)
    out = StringIO()
    call_command("recoverysweep", "--schedule", stdout=out)
    assert "Updated" in out.getvalue()

    [schedule] = Schedule.objects.filter(name=SCHEDULE_NAME)
    assert Schedule.objects.count() == 1
    assert schedule.func == "leasing.sweep.schedule.run_sweep_pass"
    assert (schedule.schedule_type, schedule.minutes, schedule.repeats) == ("I", 2, -1)
    kwargs = ast.literal_eval(schedule.kwargs)
    assert kwargs == {
        "interval": 120.0,
        "retention": 7,
        "create_checkpoints": True,
        "cleanup_old_checkpoints": True,
    }

    # What qcluster's scheduler does with it: call the function with its kwargs.
    item = expired_item("a")
    task_id = async_task(schedule.func, **kwargs)
    assert result(task_id)["recovered"] == 1
    assert WorkItem.objects.get(pk=item.pk).status == "pending"


@pytest.mark.django_db(transaction=True)
def test_scheduling_merges_duplicate_schedules(db):
    for _ in range(2):
        Schedule.objects.create(
            name=SCHEDULE_NAME,
            func="leasing.sweep.schedule.run_sweep_pass",
            schedule_type="I",
            minutes=5,
        )
    schedule, created = schedule_sweep(interval_seconds=60)
    assert created is False
    assert list(Schedule.objects.values_list("pk", "minutes")) == [(schedule.pk, 1)]
