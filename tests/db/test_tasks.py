"""The Django Tasks backend: @task functions run on leasing workers."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from io import StringIO

import django.tasks
import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection
from django.tasks import TaskBackendHandler, TaskResultStatus, default_task_backend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist

from leasing import enqueue
from leasing.exceptions import PayloadNotSerializable
from leasing.models import Checkpoint, WorkItem
from leasing.tasks import BACKEND_PATH, TASK_WORK_TYPE, LeasingBackend
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


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_arguments_too_deep_or_containing_themselves_are_refused_without_a_row():
    """normalize_json() recursed until a RecursionError escaped the enqueue."""
    looped: list = [1]
    looped.append(looped)
    looped_dict: dict = {}
    looped_dict["me"] = looped_dict
    for args, kwargs in [((nested(1200), 1), {}), ((looped, 1), {}), ((1,), {"b": looped_dict})]:
        with pytest.raises(PayloadNotSerializable, match="nested more than 100 levels deep"):
            tasks.add.enqueue(*args, **kwargs)
    assert not WorkItem.objects.exists()


def test_result_ids_no_work_item_can_have_do_not_exist():
    """A lone surrogate used to reach the database driver: UnicodeEncodeError."""
    for result_id in ["\ud800", "01\udfff", "a\x00b", None, 42, "x" * 256]:
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)


@pytest.mark.parametrize(
    "fields",
    [
        {"input_data": None},
        {"input_data": [1, 2]},
        {"input_data": {"args": []}},
        {"input_data": {"task": 5}},
        {"input_data": {"task": "tests.testapp.tasks.add", "args": "ab"}},
        {"input_data": {"task": "tests.testapp.tasks.add", "kwargs": [1]}},
        {"input_data": {"task": "nope.nowhere"}},
        {"input_data": {"task": ".x"}},
        {"input_data": {"task": "..x"}},
        {"input_data": {"task": "tests.testapp.tasks.RUNS"}},
        {"input_data": {"task": "tests.testapp.tasks.add"}, "priority": 500},
    ],
    ids=[
        "none",
        "list",
        "no-task",
        "task-not-text",
        "args-not-list",
        "kwargs-not-dict",
        "unimportable",
        "empty-module",
        "relative",
        "not-a-task",
        "priority-out-of-range",
    ],
)
def test_get_result_of_a_task_item_not_enqueued_by_the_backend_says_it_has_no_result(fields):
    """It used to raise AssertionError, TypeError, PermanentError or InvalidTask."""
    item = enqueue("direct", TASK_WORK_TYPE, **fields)
    with pytest.raises(TaskResultDoesNotExist, match="has no result of this Tasks backend"):
        default_task_backend.get_result(item.work_item_id)


def test_a_worker_fails_a_task_item_not_enqueued_by_the_backend_at_once_and_clearly():
    """A list input used to raise AttributeError in the handler, retried as transient."""
    item = enqueue("direct", TASK_WORK_TYPE, [1, 2], max_retries=3)
    drain()
    item = WorkItem.objects.get(pk=item.work_item_id)
    assert (item.status, item.retry_count) == ("failed", 0)
    assert "not a Tasks-backend task's" in item.error_message


def backend(**options) -> LeasingBackend:
    return LeasingBackend("other", {"BACKEND": BACKEND_PATH, "QUEUES": [], "OPTIONS": options})


def test_an_unknown_database_option_is_a_check_error_and_refused_at_run_time(monkeypatch):
    """It passed the check, then every get_result() raised ConnectionDoesNotExist."""
    bad = backend(DATABASE="nope")
    [error] = [m for m in bad.check() if m.id == "leasing.E013"]
    assert error.msg.startswith(
        "TASKS['other']['OPTIONS']['DATABASE'] is 'nope', which is not a database alias"
    )
    # As manage.py check sees it: Django's task check builds every backend.
    monkeypatch.setattr(
        django.tasks,
        "task_backends",
        TaskBackendHandler({"other": {"BACKEND": BACKEND_PATH, "OPTIONS": {"DATABASE": "nope"}}}),
    )
    [error] = [m for m in run_checks() if m.id == "leasing.E013"]
    assert "'nope'" in error.msg
    with pytest.raises(ImproperlyConfigured, match="'DATABASE'] is 'nope'"):
        bad.get_result("01NOPE0000000000000000000")
    with pytest.raises(ImproperlyConfigured, match="'DATABASE'] is 'nope'"):
        bad.enqueue(tasks.add, (1, 2), {})
    assert not WorkItem.objects.exists()
    assert [m.id for m in backend(DATABASE=["default"]).check()] == ["leasing.E013"]
    assert not backend(DATABASE="default").check()


def test_a_bad_max_retries_option_is_a_check_error_not_a_traceback():
    """It raised from the backend's constructor, which Django's task check calls."""
    bad = backend(MAX_RETRIES=-1)
    [error] = bad.check()
    assert error.id == "leasing.E013"
    assert "['MAX_RETRIES'] must be at least 0, got -1" in error.msg
    with pytest.raises(ImproperlyConfigured, match="MAX_RETRIES"):
        bad.enqueue(tasks.add, (1, 2), {})
    assert not WorkItem.objects.exists()
