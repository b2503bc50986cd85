"""A Django Tasks backend on leasing.

    TASKS = {"default": {"BACKEND": "leasing.tasks.LeasingBackend", "QUEUES": []}}

`@task` functions enqueue as work items of type `django.task` and `runworker`
runs them with everything a handler gets: a fenced lease, heartbeats, retries
with backoff, recovery after a crash. `get_result()` reads the item and its
`error_boundary` checkpoints: status, timestamps, errors with tracebacks,
`worker_ids` (one per attempt) and the return value.

OPTIONS: `DATABASE` (alias, default "default"), `MAX_RETRIES` (default
`LEASING["MAX_RETRIES"]`; 0 gives Django's run-once semantics),
`LEASE_DURATION` and `HEARTBEAT` ("thread" or "beat") for the task handler
(one handler: the first leasing backend's). A bad or unknown option, or a second
leasing backend setting the handler's differently, is leasing.E013, never an
exception at start-up.
A task taking context gets a `LeasingTaskContext` with `beat()` and
`checkpoint()`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils.json import normalize_json

from .context import WorkContext
from .exceptions import (
    LeasingConfigurationError,
    PayloadNotSerializable,
    PermanentError,
    UnstorableOutput,
    one_line,
)
from .handlers import build_spec, registry
from .ids import new_ulid
from .services.enqueue import enqueue
from .states import CheckpointType, WorkItemStatus
from .validation import MAX_JSON_DEPTH

if TYPE_CHECKING:
    from .models import Checkpoint, WorkItem

    _TaskContext = TaskContext[..., Any]
else:  # Django's TaskContext is not subscriptable at run time
    _TaskContext = TaskContext

TASK_WORK_TYPE = "django.task"
BACKEND_PATH = "leasing.tasks.LeasingBackend"

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
}

NOT_INSTALLED = (
    "TASKS[{alias!r}] uses leasing.tasks.LeasingBackend, but 'leasing' is not in "
    "INSTALLED_APPS: its tables, handlers and workers would not exist."
)


# The backend's OPTIONS, and those of them that configure the one `django.task` handler
# (as which of its registration options).
KNOWN_OPTIONS = ("DATABASE", "HEARTBEAT", "LEASE_DURATION", "MAX_RETRIES")
HANDLER_OPTIONS = {"LEASE_DURATION": "lease_duration", "HEARTBEAT": "heartbeat"}


def _leasing_backends() -> list[tuple[str, dict[str, Any]]]:
    """The TASKS entries (alias, config) that use this backend, in settings order."""
    configs = getattr(settings, "TASKS", {})
    if not isinstance(configs, dict):
        return []
    return [
        (alias, config)
        for alias, config in configs.items()
        if isinstance(config, dict) and config.get("BACKEND") == BACKEND_PATH
    ]


def _handler_options(alias: str, options: Any) -> tuple[dict[str, Any], list[str]]:
    """The `django.task` handler's registration options a backend's OPTIONS give, each
    validated as `registry.register` validates it, and the problems of the bad ones
    (left out: the handler's default applies)."""
    valid: dict[str, Any] = {}
    problems: list[str] = []
    if not isinstance(options, dict):
        return valid, problems
    for key, name in HANDLER_OPTIONS.items():
        if key not in options:
            continue
        value = options[key]
        try:
            spec = build_spec(TASK_WORK_TYPE, run_task, **{name: value})
        except LeasingConfigurationError as exc:
            problems.append(
                f"TASKS[{alias!r}]['OPTIONS'][{key!r}] is {value!r}, which the "
                f"{TASK_WORK_TYPE!r} handler refuses: {exc}"
            )
        else:
            valid[name] = getattr(spec, name)
    return valid, problems


def _unknown_options(alias: str, options: dict[str, Any]) -> list[str]:
    problems = []
    for key in options:
        if key in KNOWN_OPTIONS:
            continue
        message = (
            f"Unknown option TASKS[{alias!r}]['OPTIONS'][{key!r}]. "
            f"Known options: {', '.join(KNOWN_OPTIONS)}."
        )
        close = difflib.get_close_matches(str(key).upper(), KNOWN_OPTIONS, n=1)
        if close:
            message += f" Did you mean {close[0]!r}?"
        problems.append(message)
    return problems


def _handler_conflicts(alias: str, options: dict[str, Any]) -> list[str]:
    """The handler options this backend sets apart from the first leasing backend's:
    `django.task` has one handler, registered with the first's (register_task_handler).
    An option this backend leaves out is the first's, as documented."""
    backends = _leasing_backends()
    if not backends or backends[0][0] == alias:
        return []
    first, config = backends[0]
    own, _ = _handler_options(alias, options)  # a bad one is reported as such
    registered = build_spec(
        TASK_WORK_TYPE, run_task, **_handler_options(first, config.get("OPTIONS", {}))[0]
    )
    problems = []
    for key, name in HANDLER_OPTIONS.items():
        if name not in own or own[name] == getattr(registered, name):
            continue
        problems.append(
            f"TASKS[{alias!r}]['OPTIONS'][{key!r}] is {options[key]!r}, but the first "
            f"leasing backend, TASKS[{first!r}], gives {_shown(getattr(registered, name))}: "
            f"work type {TASK_WORK_TYPE!r} has one handler, registered with the first "
            "leasing backend's LEASE_DURATION and HEARTBEAT, so this backend's tasks "
            "would not run with its own."
        )
    return problems


def _shown(value: Any) -> str:
    return "no LEASE_DURATION (the worker's lease)" if value is None else repr(value)


def _require_app(alias: str) -> None:
    if not apps.is_installed("leasing"):
        raise ImproperlyConfigured(NOT_INSTALLED.format(alias=alias))


@dataclass(frozen=True, slots=True, kw_only=True)
# django-stubs declares TaskContext a non-frozen dataclass; Django's is frozen.
class LeasingTaskContext(_TaskContext):  # type: ignore[misc]
    """Django's TaskContext plus the leasing handler context."""

    work: WorkContext

    def beat(self) -> None:
        self.work.beat()

    def checkpoint(
        self, checkpoint_type: str, snapshot: Any, metadata: dict[str, Any] | None = None
    ) -> Checkpoint:
        return self.work.checkpoint(checkpoint_type, snapshot, metadata)

    def resume_state(self) -> Any:
        return self.work.resume_state()

    @property
    def lease_lost(self) -> bool:
        return self.work.lease_lost


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
        self.option_problems += _unknown_options(alias, self.options)
        using = self.options.get("DATABASE", "default")
        if not isinstance(using, str) or using not in settings.DATABASES:
            known = ", ".join(repr(name) for name in settings.DATABASES) or "none"
            self.option_problems.append(
                f"TASKS[{alias!r}]['OPTIONS']['DATABASE'] is {using!r}, which is not a database "
                f"alias of DATABASES (aliases: {known}): every enqueue and get_result() would fail."
            )
            using = "default"
        self.using: str = using
        max_retries = self.options.get("MAX_RETRIES")
        if max_retries is not None and (
            isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
        ):
            self.option_problems.append(
                f"TASKS[{alias!r}]['OPTIONS']['MAX_RETRIES'] must be a whole number >= 0, "
                f"got {max_retries!r}."
            )
            max_retries = None
        self.max_retries: int | None = max_retries
        self.option_problems += _handler_options(alias, self.options)[1]
        self.option_problems += _handler_conflicts(alias, self.options)

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
        return messages

    def _require_usable(self) -> None:
        _require_app(self.alias)
        if self.option_problems:
            raise ImproperlyConfigured(self.option_problems[0])

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
            priority=task.priority,
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
        from .models import Checkpoint, WorkItem

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
            task = _as_enqueued(_load_task(_task_input(item.input_data)["task"]), item, self.alias)
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
                exception_class_path=b.get("exception_class_path")
                or "leasing.exceptions.LeaseExpiredError",
                traceback=b.get("traceback") or b.get("error") or "",
            )
            for b in boundaries
            if b.get("reason") != "interrupted"
        ]
        worker_ids = [str(b.get("worker_id") or "") for b in boundaries]
        if item.status == WorkItemStatus.IN_PROGRESS and item.lease_holder:
            worker_ids.append(item.lease_holder)
        elif item.status == "completed" and isinstance(item.output_data, dict):
            worker_ids.append(item.output_data.get("worker_id", ""))
        status = _STATUS[item.status]
        data = _task_input(item.input_data)
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


def _task_input(data: Any) -> dict[str, Any]:
    """The input of an item this backend enqueued: its task's path, args and kwargs.

    Anything else (a `django.task` item enqueued with `leasing.enqueue()`) is a
    PermanentError: the worker fails the item, get_result() says it is no task result.
    """
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("task"), str)
        or not isinstance(data.get("args", []), list)
        or not isinstance(data.get("kwargs", {}), dict)
        or not isinstance(data.get("backend", "default"), str)
    ):
        raise PermanentError(
            "the item's input is not a Tasks-backend task's ({'task': '<dotted path>', "
            "'args': [...], 'kwargs': {...}, 'backend': '<alias>'}); enqueue tasks with "
            "Task.enqueue(), not leasing.enqueue()."
        )
    return {
        **data,
        "args": data.get("args", []),
        "kwargs": data.get("kwargs", {}),
        "backend": data.get("backend", "default"),
    }


def _as_enqueued(task: Task[..., Any], item: WorkItem, alias: str) -> Task[..., Any]:
    """The task as it was enqueued: `.using()` may have changed priority, queue and time."""
    return dataclasses.replace(
        task,
        priority=item.priority,
        queue_name=item.queue_name,
        run_after=item.run_after,
        backend=alias,
    )


# What a PermanentError of a task item whose code or backend has changed tells the operator
# to do: the worker's code and settings stay what they are until it restarts, so no
# automatic retry can succeed.
THEN_RETRY = "then retry the item (the admin's Retry, or leasing.apply_action('retry', ...))."


def _load_task(path: str) -> Task[..., Any]:
    """The task at `path`, or a PermanentError saying why there is none any more.

    An ImportError raised inside the task's module (a dependency missing, a circular
    import) is permanent too: Python runs a failed import again, but nothing between two
    attempts changes the code the worker sees. Any other exception of the import (the
    database down, a network call at import time) propagates as it is: an interruption
    or a retried failure, as the same exception raised by the task would be.
    """
    module_path, _, name = path.rpartition(".")
    if not module_path or not name:
        raise PermanentError(f"{path!r} is no task's dotted path.")
    try:
        module = importlib.import_module(module_path)
    except (ValueError, TypeError) as exc:  # "..x": a relative import
        raise PermanentError(f"{path!r} is no task's dotted path ({exc}).") from exc
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and _names_module(exc.name, module_path):
            raise PermanentError(
                f"task {path!r} cannot be imported: module {module_path!r} does not exist "
                f"any more (removed or renamed since the task was enqueued). Restore it, "
                f"{THEN_RETRY}"
            ) from exc
        raise PermanentError(
            f"task {path!r} cannot be imported: importing module {module_path!r} raised "
            f"{one_line(exc)}. Fix the import, {THEN_RETRY}"
        ) from exc
    task = getattr(module, name, None)
    if task is None:
        raise PermanentError(
            f"task {path!r} cannot be imported: module {module_path!r} has no {name!r} any "
            f"more (removed or renamed since the task was enqueued). Restore it, {THEN_RETRY}"
        )
    if not isinstance(task, Task):
        raise PermanentError(
            f"{path!r} is no longer a Task but a {type(task).__name__}: decorate it with "
            f"@task again, {THEN_RETRY}"
        )
    return task


def _names_module(missing: str | None, module_path: str) -> bool:
    """Whether the module a ModuleNotFoundError misses is `module_path` or a package of
    it (rather than a module that `module_path` imports)."""
    return bool(missing) and (module_path == missing or module_path.startswith(f"{missing}."))


def _check_arguments(
    task: Task[..., Any], path: str, args: list[Any], kwargs: dict[str, Any]
) -> None:
    """A PermanentError if the task's function no longer accepts its stored arguments
    (its parameters changed since it was enqueued): calling it would raise the same
    TypeError on every attempt. The function's own signature, not the one a decorator's
    `functools.wraps` copies from the function it wraps: that one is what is called."""
    try:
        signature = inspect.signature(task.func, follow_wrapped=False)
    except (TypeError, ValueError):  # no signature to check: the call tells
        return
    context = [None] if task.takes_context else []
    try:
        signature.bind(*context, *args, **kwargs)
    except TypeError as exc:
        raise PermanentError(
            f"task {path!r} no longer accepts the arguments it was enqueued with ({exc}): "
            f"give it back the parameters it had, {THEN_RETRY}"
        ) from exc


def _task_backend(alias: str) -> LeasingBackend:
    """The backend the item was enqueued through, as TASKS gives it now; a PermanentError
    if TASKS no longer has it, or no longer as a usable leasing backend."""
    from django.tasks import task_backends

    if alias not in task_backends.settings:
        raise PermanentError(
            f"TASKS has no backend {alias!r} any more (the task was enqueued through it): "
            f"restore it, {THEN_RETRY}"
        )
    try:
        backend = task_backends[alias]
    except ImproperlyConfigured as exc:  # InvalidTaskBackend: its BACKEND cannot be imported
        raise PermanentError(
            f"TASKS[{alias!r}] cannot be loaded ({exc}): fix it, {THEN_RETRY}"
        ) from exc
    if not isinstance(backend, LeasingBackend):
        kind = type(backend)
        raise PermanentError(
            f"TASKS[{alias!r}] is now '{kind.__module__}.{kind.__qualname__}', not "
            f"{BACKEND_PATH!r}, the backend the task was enqueued through: point it back at "
            f"{BACKEND_PATH!r}, {THEN_RETRY}"
        )
    if backend.option_problems:  # leasing.E013
        raise PermanentError(
            f"TASKS[{alias!r}] cannot run tasks: {backend.option_problems[0]} Fix it, {THEN_RETRY}"
        )
    return backend


def run_task(ctx: WorkContext) -> dict[str, Any]:
    """The handler of `django.task` items: call the task, return its value."""
    data = _task_input(ctx.input)
    task = _load_task(data["task"])
    args, kwargs = data["args"], data["kwargs"]
    _check_arguments(task, data["task"], args, kwargs)
    backend = _task_backend(data["backend"])
    try:
        result = backend.get_result(ctx.lease.work_item_id)
    except TaskResultDoesNotExist as exc:
        # The item is not a task this backend can run (see get_result): retrying cannot help.
        raise PermanentError(str(exc)) from exc
    task_started.send(type(backend), task_result=result)
    try:
        if task.takes_context:
            value = task.call(LeasingTaskContext(task_result=result, work=ctx), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        try:
            value = normalize_json(value)
        except (TypeError, ValueError) as exc:
            raise UnstorableOutput(
                f"the task's return value cannot be stored as JSON ({exc}); not retried", exc
            ) from exc
    except BaseException:
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        task_finished.send(type(backend), task_result=result)
        raise
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", value)
    task_finished.send(type(backend), task_result=result)
    return {"return_value": value, "worker_id": ctx.worker_id}


def register_task_handler() -> None:  # called by LeasingConfig.ready()
    """Register `run_task` for `django.task` when a TASKS backend uses leasing, with the
    LEASE_DURATION and HEARTBEAT of the first such backend.

    Never raises: a bad option is left out (the handler's default applies) and is the
    backend's leasing.E013, as is another leasing backend that sets them differently.
    """
    for alias, config in _leasing_backends():
        options, _ = _handler_options(alias, config.get("OPTIONS", {}))
        registry.register(TASK_WORK_TYPE, run_task, replace=True, **options)
        return


def uses_leasing_backend() -> bool:
    return bool(_leasing_backends())


__all__ = ["TASK_WORK_TYPE", "LeasingBackend", "LeasingTaskContext", "run_task"]
