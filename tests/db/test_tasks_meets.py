"""The Tasks backend meets the engine's other features: operators, the sweep, time-outs,
interruptions, and inputs Django's checks let through but the engine cannot store.

What `get_result()` reports must never be healthier than the item's row, nor raise
anything but `TaskResultDoesNotExist`; a bad `Task.using()` is `InvalidTask`, never a
`TypeError` from a comparison.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
from asgiref.sync import async_to_sync
from django.tasks import TaskResultStatus, default_task_backend, task
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_finished

from leasing import LeaseManager, apply_action, cancel, enqueue
from leasing.exceptions import DatabaseUnavailable, InvalidInput, PayloadNotSerializable
from leasing.models import WorkItem
from leasing.testing import drain
from tests.support.recovery import expire, sweep
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


# Module level, as Django requires of a task function.
@task
def always_interrupted() -> None:
    raise DatabaseUnavailable("the database went away")


@task
def sleeps(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


@task(takes_context=True)
def cancels_itself_then_fails(context) -> None:
    cancel(context.task_result.id, actor="ops", reason="not needed")
    raise ValueError("stopped")


@task(takes_context=True)
def force_failed_while_running(context) -> str:
    apply_action(
        "force_fail", context.task_result.id, expected_token=None, actor="ops", reason="stuck"
    )
    return "finished anyway"


# Every run of `returns`, by its argument (a side effect that must not repeat).
RUNS: list[str] = []


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@task
def returns(kind: str) -> object:
    RUNS.append(kind)
    looped: list = [1]
    looped.append(looped)
    return {
        "too-deep-for-normalize-json": nested(1200),
        "itself": looped,
        "too-deep-for-a-payload": nested(150),
        "nan": float("nan"),
        "nul": "a\x00b",
        "surrogate": "\ud800",
        "too-large": "x" * 2000,
    }[kind]


def status(result_id: str) -> str:
    return WorkItem.objects.get(pk=result_id).status


# --- what get_result() says of what the engine did ----------------------------------------


def test_a_cancelled_pending_task_is_failed_and_finished():
    result = tasks.add.enqueue(1, 2)
    cancel(result.id, actor="ops", reason="not needed")
    result.refresh()
    assert status(result.id) == "cancelled"
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_a_running_task_cancelled_then_failing_is_failed_with_its_error():
    result = cancels_itself_then_fails.enqueue()
    drain()
    result.refresh()
    assert status(result.id) == "cancelled"
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [ValueError]
    assert result.finished_at is not None and result.attempts == 1


def test_a_task_force_failed_while_it_runs_is_failed_though_it_returned(leasing_settings):
    leasing_settings(MAX_RETRIES=0)
    result = force_failed_while_running.enqueue()
    drain()
    result.refresh()
    assert status(result.id) == "failed"
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at is not None
    assert result.errors == []  # the operator's reason is in the item's message and audit


def test_a_task_force_failed_pending_and_retried_by_an_operator_is_ready_again():
    result = tasks.add.enqueue(1, 2)
    apply_action("force_fail", result.id, expected_token=None, actor="ops", reason="hold")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.finished_at is not None
    apply_action("retry", result.id, expected_token=None, actor="ops", reason="go")
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.finished_at is None
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3


def test_a_task_force_released_is_ready_again():
    result = tasks.add.enqueue(1, 2)
    lease = LeaseManager("w1").acquire_lease()
    assert lease is not None
    assert tasks.add.get_result(result.id).status == TaskResultStatus.RUNNING
    apply_action("force_release", result.id, expected_token=None, actor="ops", reason="stuck")
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.finished_at is None and result.last_attempted_at is not None


@pytest.mark.parametrize(("retries", "expected"), [(0, "FAILED"), (2, "READY")])
def test_a_task_whose_lease_expired_and_was_swept(leasing_settings, retries, expected):
    leasing_settings(MAX_RETRIES=retries)
    result = tasks.add.enqueue(1, 2)
    assert LeaseManager("dead").acquire_lease() is not None
    expire(result.id)
    sweep().scan_and_recover()
    result.refresh()
    assert result.status == expected
    [error] = result.errors
    assert error.exception_class.__name__ == "LeaseExpiredError"
    assert result.worker_ids == ["dead"]
    assert (result.finished_at is not None) == (expected == "FAILED")


def test_a_running_task_asked_to_stop_whose_lease_expired_is_failed():
    result = tasks.add.enqueue(1, 2)
    assert LeaseManager("dead").acquire_lease() is not None
    cancel(result.id, actor="ops", reason="not needed")
    expire(result.id)
    sweep().scan_and_recover()
    result.refresh()
    assert status(result.id) == "cancelled"
    assert result.status == TaskResultStatus.FAILED and result.finished_at is not None


def test_a_task_that_timed_out_is_failed_though_it_returned(leasing_settings):
    leasing_settings(MAX_RETRIES=0, MAX_LEASE_LIFETIME=0.2)
    result = sleeps.enqueue(0.3)
    drain()
    result.refresh()
    assert status(result.id) == "failed"
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert "Timed out" in error.traceback


def test_a_task_failed_by_its_interruptions_lists_the_error_that_failed_it(leasing_settings):
    """Interruptions cost no attempt, and are no error of the task; but the fifth in a row
    counts as a failure, and a task that fails of it must not report no error."""
    leasing_settings(MAX_RETRIES=0)
    result = always_interrupted.enqueue()
    drain()
    result.refresh()
    assert status(result.id) == "failed"
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors  # the four before it were handed back, no error of the task
    assert "interruptions in a row" in error.traceback
    assert error.exception_class is DatabaseUnavailable
    assert result.attempts == 5


def test_a_row_in_the_schemas_expired_status_is_no_traceback():
    """The schema allows `expired` (no transition enters it): get_result() raised KeyError."""
    result = tasks.add.enqueue(1, 2)
    assert LeaseManager("w1").acquire_lease() is not None
    WorkItem.objects.filter(pk=result.id).update(status="expired")
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    assert not result.is_finished and result.finished_at is None


# --- return values JSON cannot hold -------------------------------------------------------


@pytest.mark.parametrize(
    "kind",
    [
        "too-deep-for-normalize-json",
        "itself",
        "too-deep-for-a-payload",
        "nan",
        "nul",
        "surrogate",
        "too-large",
    ],
)
def test_a_return_value_the_item_cannot_store_fails_the_task_once_and_says_so(
    leasing_settings, kind
):
    """A value normalize_json() recursed on escaped as RecursionError and was retried; one
    it let through (NaN, a NUL, too deep or too large for a payload) was sent to
    task_finished as SUCCESSFUL before the worker failed the item."""
    leasing_settings(MAX_RETRIES=2, RETRY_BACKOFF_BASE=0.01, MAX_PAYLOAD_BYTES=1000)
    finished: list[TaskResultStatus] = []

    def receiver(sender, task_result, **kwargs):
        finished.append(task_result.status)

    RUNS.clear()
    task_finished.connect(receiver)
    try:
        result = returns.enqueue(kind)
        drain(retry_now=True)
    finally:
        task_finished.disconnect(receiver)
    result.refresh()
    assert [kind] == RUNS  # not retried: its effects ran once
    assert finished == [TaskResultStatus.FAILED]
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    [error] = result.errors
    assert issubclass(error.exception_class, InvalidInput)
    item = WorkItem.objects.get(pk=result.id)
    assert (item.status, item.retry_count) == ("failed", 0)
    assert "cannot be stored as JSON" in item.error_message


# --- ids that are no task's -----------------------------------------------------------------


def test_an_id_of_an_item_of_another_work_type_or_empty_is_no_result():
    item = enqueue("plain", "noop")
    for result_id in [item.work_item_id, "", "not-a-ulid", "x" * 10_000]:
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)


# --- Task.using() ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "using",
    [
        {"priority": "5"},
        {"priority": float("nan")},
        {"priority": [1]},
        {"run_after": "2030-01-01T00:00:00Z"},
        {"run_after": 1893456000},
        {"queue_name": ["a"]},
    ],
    ids=[
        "priority-text",
        "priority-nan",
        "priority-list",
        "run-after-text",
        "run-after-number",
        "queue-list",
    ],
)
def test_a_task_with_a_bad_option_is_invalid_task(using):
    """Django's own check compared them and raised TypeError, ValueError or AttributeError."""
    with pytest.raises(InvalidTask):
        tasks.add.using(**using)
    assert not WorkItem.objects.exists()


def test_a_whole_float_priority_enqueues_as_its_integer():
    """Django accepts priority 5.0 (a whole number); the engine refused it as no integer."""
    result = tasks.add.using(priority=5.0).enqueue(1, 2)
    assert WorkItem.objects.get(pk=result.id).priority == 5
    assert tasks.add.get_result(result.id).task.priority == 5


@pytest.mark.parametrize(
    "when",
    [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
        datetime(9999, 12, 31, 23, 59, tzinfo=UTC),
    ],
    ids=["year-1", "before-year-1-in-utc", "after-9999-in-utc", "year-9999"],
)
def test_run_after_far_away(when):
    try:
        result = tasks.add.using(run_after=when).enqueue(1, 2)
    except (InvalidTask, InvalidInput):
        assert not WorkItem.objects.exists()
        return
    got = tasks.add.get_result(result.id)
    assert got.status == TaskResultStatus.READY
    assert got.task.run_after == when


# --- the async API --------------------------------------------------------------------------


def test_aenqueue_and_aget_result_refuse_as_their_sync_twins():
    with pytest.raises(PayloadNotSerializable):
        async_to_sync(tasks.add.aenqueue)(float("nan"), 1)
    with pytest.raises(PayloadNotSerializable):
        async_to_sync(tasks.add.aenqueue)("\ud800", 1)
    assert not WorkItem.objects.exists()
    for result_id in ["", "\x00", "x" * 10_000]:
        with pytest.raises(TaskResultDoesNotExist):
            async_to_sync(default_task_backend.aget_result)(result_id)
    result = async_to_sync(tasks.add.aenqueue)(1, 2)
    got = async_to_sync(tasks.add.aget_result)(result.id)
    assert got.status == TaskResultStatus.READY and got.args == [1, 2]
