"""`LeasingBackend`: Django's Tasks API on leasing's work items.

`enqueue()` stores a `django.task` item (`stored`); `get_result()` reads the
item and its `error_boundary` checkpoints back as a `TaskResult`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.json import normalize_json

from ..conf import WRITE_DATABASE
from ..exceptions import PayloadNotSerializable, PermanentError
from ..ids import new_ulid
from ..services.enqueue import enqueue
from ..states import CheckpointType, WorkItemStatus
from ..validation import MAX_JSON_DEPTH
from .options import handler_conflicts, handler_options, max_retries_option, unknown_options
from .stored import TASK_WORK_TYPE, load_task, task_input

if TYPE_CHECKING:
    from ..models import WorkItem

# This module must import without the leasing models, so that a site that
# forgot INSTALLED_APPS gets the system check below instead of a RuntimeError
# from the model import (the enumerations of leasing.states need no models).
_STATUS = {
    WorkItemStatus.PENDING.value: TaskResultStatus.READY,
    WorkItemStatus.IN_PROGRESS.value: TaskResultStatus.RUNNING,
    WorkItemStatus.COMPLETED.value: TaskResultStatus.SUCCESSFUL,
    WorkItemStatus.FAILED.value: TaskResultStatus.FAILED,
    # Django's Tasks have no cancelled status: a cancelled task did not succeed.
    WorkItemStatus.CANCELLED.value: TaskResultStatus.FAILED,
    # Allowed by the schema, entered by no transition: a lease that ran out and awaits
    # the sweep, which an in_progress item with an expired lease reports as RUNNING too.
    WorkItemStatus.EXPIRED.value: TaskResultStatus.RUNNING,
}
# The holder of a row in these statuses is running it (or was, until its lease ran out).
_HELD = (WorkItemStatus.IN_PROGRESS.value, WorkItemStatus.EXPIRED.value)


NOT_INSTALLED = (
    "TASKS[{alias!r}] uses leasing.tasks.LeasingBackend, but 'leasing' is not in "
    "INSTALLED_APPS: its tables, handlers and workers would not exist."
)

# A worker and a sweep serve one database, the default unless --database says otherwise;
# the console and /metrics read the default (or LEASING["READ_DATABASE"], its replica).
OTHER_DATABASE = (
    "TASKS[{alias!r}] enqueues to database {using!r}, not the default: its tasks run only "
    "under `runworker --database {using}`, expired ones are recovered only by "
    "`recoverysweep --database {using}`, and the console and /metrics, which read the "
    "default database (or LEASING['READ_DATABASE']), do not show them."
)


def _require_app(alias: str) -> None:
    if not apps.is_installed("leasing"):
        raise ImproperlyConfigured(NOT_INSTALLED.format(alias=alias))


class LeasingBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Bad OPTIONS are not raised here: Django's task checks build every backend,
        # so raising would turn leasing.E013 into a traceback. check() reports them,
        # enqueue() and get_result() refuse with the same message.
        self.option_problems: list[str] = []
        if not isinstance(self.options, dict):
            self.option_problems.append(
                f"TASKS[{alias!r}]['OPTIONS'] must be a dict, got {type(self.options).__name__}."
            )
            self.options = {}
        self.option_problems += unknown_options(alias, self.options)
        using = self.options.get("DATABASE", "default")
        if not isinstance(using, str) or using not in settings.DATABASES:
            known = ", ".join(repr(name) for name in settings.DATABASES) or "none"
            self.option_problems.append(
                f"TASKS[{alias!r}]['OPTIONS']['DATABASE'] is {using!r}, which is not a database "
                f"alias of DATABASES (aliases: {known}): every enqueue and get_result() would fail."
            )
            using = "default"
        self.using: str = using
        self.max_retries: int | None
        self.max_retries, problems = max_retries_option(alias, self.options)
        self.option_problems += problems
        self.option_problems += handler_options(alias, self.options)[1]
        self.option_problems += handler_conflicts(alias, self.options)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages = list(super().check(**kwargs))
        if not apps.is_installed("leasing"):
            messages.append(
                checks.Error(
                    NOT_INSTALLED.format(alias=self.alias),
                    hint="Add 'leasing' to INSTALLED_APPS and run manage.py migrate.",
                    id="leasing.E005",
                )
            )
        messages += [
            checks.Error(
                problem,
                hint="Fix the option; they are listed in docs/how-to/django-tasks.md.",
                id="leasing.E013",
            )
            for problem in self.option_problems
        ]
        if self.using != WRITE_DATABASE:  # a bad DATABASE is E013, and self.using the default
            messages.append(
                checks.Warning(
                    OTHER_DATABASE.format(alias=self.alias, using=self.using),
                    hint=f"Run runworker and recoverysweep with --database {self.using} "
                    "(docs/how-to/django-tasks.md), then silence this warning with "
                    'SILENCED_SYSTEM_CHECKS = ["leasing.W011"].',
                    id="leasing.W011",
                )
            )
        return messages

    def _require_usable(self) -> None:
        _require_app(self.alias)
        if self.option_problems:
            raise ImproperlyConfigured(self.option_problems[0])

    def validate_task(self, task: Task[..., Any]) -> None:
        """Django's checks, after the types they assume: they compare before they check, so
        a priority "5" raised TypeError, NaN ValueError, a run_after "2030-01-01"
        AttributeError and an unhashable queue name TypeError, instead of InvalidTask."""
        priority = task.priority
        if not isinstance(priority, numbers.Real | Decimal) or not math.isfinite(priority):
            raise InvalidTask(
                f"priority must be a whole number between {TASK_MIN_PRIORITY} and "
                f"{TASK_MAX_PRIORITY}, got {priority!r}."
            )
        if task.run_after is not None and not isinstance(task.run_after, datetime):
            raise InvalidTask(f"run_after must be an aware datetime, got {task.run_after!r}.")
        if not isinstance(task.queue_name, str):
            raise InvalidTask(f"queue_name must be a string, got {task.queue_name!r}.")
        super().validate_task(task)

    def enqueue[**P, R](self, task: Task[P, R], args: Any, kwargs: Any) -> TaskResult[P, R]:
        self._require_usable()

        self.validate_task(task)
        try:
            arguments = {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))}
        except RecursionError:
            # normalize_json() recurses: very deep arguments, or a list that contains itself.
            raise PayloadNotSerializable(
                f"Arguments of task {task.module_path} are nested more than {MAX_JSON_DEPTH} "
                "levels deep (or contain themselves)."
            ) from None
        except (TypeError, ValueError) as exc:
            raise PayloadNotSerializable(
                f"Arguments of task {task.module_path} are not JSON-serializable: {exc}"
            ) from exc
        item = enqueue(
            task_id=new_ulid(),
            work_type=TASK_WORK_TYPE,
            input_data={"task": task.module_path, **arguments, "backend": self.alias},
            # A whole number (validate_task): 5.0 as Django allows it, stored as 5.
            priority=int(task.priority),
            max_retries=self.max_retries,
            run_after=task.run_after,
            queue_name=task.queue_name,
            using=self.using,
        )
        result = self._result(task, item, [])
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        self._require_usable()
        if not _storable_id(result_id):
            raise TaskResultDoesNotExist(result_id)
        # Imported here: this module must import without the leasing models
        # (see _STATUS), and the app check above has passed.
        from ..models import Checkpoint, WorkItem

        item = (
            WorkItem.objects.using(self.using)
            .filter(pk=result_id, work_type=TASK_WORK_TYPE)
            .first()
        )
        if item is None:
            raise TaskResultDoesNotExist(result_id)
        # A django.task item enqueued by leasing.enqueue() directly, or whose task has
        # since gone or no longer suits this backend (priority, queue): no TaskResult
        # can be built for it.
        try:
            task = _as_enqueued(load_task(task_input(item.input_data)["task"]), item, self.alias)
        except (PermanentError, InvalidTask) as exc:
            raise TaskResultDoesNotExist(
                f"Work item {result_id!r} has no result of this Tasks backend: {exc}"
            ) from exc
        boundaries = list(
            Checkpoint.objects.using(self.using)
            .filter(task_id=item.task_id, checkpoint_type=CheckpointType.ERROR_BOUNDARY)
            .order_by("sequence_number")
            .values_list("snapshot_data", flat=True)
        )
        return self._result(task, item, boundaries)

    def _result[**P, R](
        self, task: Task[P, R], item: WorkItem, boundaries: list[dict[str, Any]]
    ) -> TaskResult[P, R]:
        errors = [
            TaskError(
                exception_class_path=b.get("exception_class_path") or _default_class(b),
                traceback=b.get("traceback") or b.get("error") or "",
            )
            for b in boundaries
            if not _uncounted_interruption(b)
        ]
        worker_ids = [str(b.get("worker_id") or "") for b in boundaries]
        if item.status in _HELD and item.lease_holder:
            worker_ids.append(item.lease_holder)
        elif item.status == "completed" and isinstance(item.output_data, dict):
            worker_ids.append(item.output_data.get("worker_id", ""))
        status = _STATUS[item.status]
        data = task_input(item.input_data)
        result = TaskResult(
            task=task,
            id=item.work_item_id,
            status=status,
            enqueued_at=item.created_at,
            started_at=item.started_at,
            finished_at=item.completed_at if status in _FINISHED else None,
            last_attempted_at=item.lease_acquired_at,
            args=data["args"],
            kwargs=data["kwargs"],
            backend=self.alias,
            errors=errors,
            worker_ids=[w for w in worker_ids if w],
        )
        if status == TaskResultStatus.SUCCESSFUL and isinstance(item.output_data, dict):
            object.__setattr__(result, "_return_value", item.output_data.get("return_value"))
        return result


_FINISHED = {TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED}


def _uncounted_interruption(boundary: dict[str, Any]) -> bool:
    """An attempt the database cut short and handed back without counting it: no error of
    the task. The one that ends a run of MAX_INTERRUPTIONS counts like a failure (a retry
    used, or the item failed) and is one."""
    return (
        boundary.get("reason") == "interrupted"
        and boundary.get("new_status") == WorkItemStatus.PENDING
        and boundary.get("retry_count") == (boundary.get("attempt") or 1) - 1
    )


def _default_class(boundary: dict[str, Any]) -> str:
    """The exception an ending that recorded none stands for: the sweep's and a time-out's
    are an expired lease, a counted interruption the database's outage."""
    if boundary.get("reason") == "interrupted":
        return "leasing.exceptions.DatabaseUnavailable"
    return "leasing.exceptions.LeaseExpiredError"


def _storable_id(result_id: Any) -> bool:
    """Whether `result_id` can be looked up at all: a string the id column can hold
    (not too long, no NUL, no lone surrogate, which the database driver cannot encode)."""
    if not isinstance(result_id, str) or "\x00" in result_id or len(result_id) > 255:
        return False
    try:
        result_id.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _as_enqueued(task: Task[..., Any], item: WorkItem, alias: str) -> Task[..., Any]:
    """The task as it was enqueued: `.using()` may have changed priority, queue and time."""
    return dataclasses.replace(
        task,
        priority=item.priority,
        queue_name=item.queue_name,
        run_after=item.run_after,
        backend=alias,
    )
