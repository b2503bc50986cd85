"""What a `django.task` item stores, and the task it names, loaded as the code is now.

The item's input is `{"task": "<dotted path>", "args": [...], "kwargs": {...},
"backend": "<alias>"}`. A task whose module, function or parameters have changed
since it was enqueued fails its item at once (`PermanentError`): the worker's code
stays what it is until it restarts, so no automatic retry could succeed.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from django.tasks import Task

from ..exceptions import PermanentError, one_line

TASK_WORK_TYPE = "django.task"
BACKEND_PATH = "leasing.tasks.LeasingBackend"


# What a PermanentError of a task item whose code or backend has changed tells the operator
# to do: the worker's code and settings stay what they are until it restarts, so no
# automatic retry can succeed.
THEN_RETRY = "then retry the item (the admin's Retry, or leasing.apply_action('retry', ...))."


def task_input(data: Any) -> dict[str, Any]:
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


def load_task(path: str) -> Task[..., Any]:
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


def check_arguments(
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
