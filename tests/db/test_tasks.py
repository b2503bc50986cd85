"""The Django Tasks backend: @task functions run on leasing workers."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist

from leasing.exceptions import PayloadNotSerializable
from leasing.models import Checkpoint, WorkItem
from leasing.tasks import TASK_WORK_TYPE, LeasingBackend
from tests.support.helpers import database_now
from tests.support.workers import FAST_POLL
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fast_poll(leasing_settings):
    leasing_settings(**FAST_POLL)


def drain() -> None:
    call_command("runworker", "--burst", stdout=StringIO())


def test_backend_declares_its_features():
    backend = tasks.add.get_backend()
    assert isinstance(backend, LeasingBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task


def test_enqueue_creates_a_ready_work_item_with_priority_queue_and_run_after():
    when = database_now() + timedelta(hours=1)
    result = tasks.urgent_echo.using(run_after=when).enqueue("hi")
    assert result.status == TaskResultStatus.READY
    item = WorkItem.objects.get(pk=result.id)
    assert item.work_type == TASK_WORK_TYPE
    assert (item.priority, item.queue_name, item.run_after) == (10, "urgent", when)
    assert item.input_data["task"] == "tests.testapp.tasks.urgent_echo"
    assert item.input_data["args"] == ["hi"]
    drain()  # run_after is in the future: nothing runs
    assert tasks.urgent_echo.get_result(result.id).status == TaskResultStatus.READY


def test_successful_task_result():
    result = tasks.add.enqueue(2, b=3)
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == []
    assert len(result.worker_ids) == 1 and result.attempts == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


def test_failed_task_records_each_attempt(leasing_settings):
    leasing_settings(MAX_RETRIES=1, RETRY_BACKOFF_BASE=0.01)
    result = tasks.explode.enqueue()
    drain()
    result = tasks.explode.get_result(result.id)
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 2
    assert result.errors[0].exception_class is ValueError
    assert "kaboom" in result.errors[-1].traceback
    assert result.attempts == 2
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_status_goes_ready_running_successful():
    result = tasks.slow.enqueue(1.0)
    assert result.status == TaskResultStatus.READY
    worker = threading.Thread(target=lambda: (drain(), connection.close()))
    worker.start()
    seen = set()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        current = tasks.slow.get_result(result.id)
        seen.add(current.status)
        if current.status == TaskResultStatus.RUNNING:
            assert len(current.worker_ids) == 1
        if current.is_finished:
            break
        time.sleep(0.05)
    worker.join()
    assert TaskResultStatus.RUNNING in seen
    assert tasks.slow.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_task_with_context_can_beat_and_checkpoint():
    result = tasks.with_context.enqueue(7)
    drain()
    result.refresh()
    assert result.return_value == {"attempt": 1, "lease_lost": False}
    item = WorkItem.objects.get(pk=result.id)
    cp = Checkpoint.objects.get(task_id=item.task_id)
    assert cp.checkpoint_type == "manual_checkpoint" and cp.snapshot_data == {"n": 7}


def test_async_task_functions_are_supported():
    result = tasks.async_double.enqueue(21)
    drain()
    result.refresh()
    assert result.return_value == 42


def test_unknown_result_id():
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("01NOPE0000000000000000000")


def test_bad_task_input_is_refused_without_a_row():
    with pytest.raises(PayloadNotSerializable):
        tasks.add.enqueue(object(), 1)
    with pytest.raises(InvalidTask):
        tasks.add.using(priority=500)
    assert not WorkItem.objects.exists()


@pytest.mark.parametrize("kind", ["datetime", "set", "decimal"])
def test_a_task_whose_return_value_json_cannot_hold_runs_once_and_fails_with_type_error(kind):
    tasks.RUNS.clear()
    result = tasks.returns_unstorable.enqueue(kind)
    drain()
    result.refresh()
    assert len(tasks.RUNS) == 1 and tasks.RUNS[0] == kind  # not retried: its effects ran once
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    [error] = result.errors
    assert error.exception_class is TypeError
    item = WorkItem.objects.get(pk=result.id)
    assert (item.status, item.retry_count) == ("failed", 0)
    assert "cannot be stored as JSON" in item.error_message
