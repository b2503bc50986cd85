"""`run_task`: the handler of `django.task` items, run by `runworker` like any other.

Before the task runs, the item is checked against the code and settings as they
are now (`stored`, `_task_backend`); then Django's `task_started` and
`task_finished` signals go out around the call, and the return value is stored
as JSON or the run fails as `UnstorableOutput` (not retried).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskContext, TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

from .. import validation
from ..context import WorkContext
from ..exceptions import PayloadNotSerializable, PermanentError, UnstorableOutput
from .stored import BACKEND_PATH, THEN_RETRY, check_arguments, load_task, task_input

if TYPE_CHECKING:
    from ..models import Checkpoint
    from .backend import LeasingBackend

    _TaskContext = TaskContext[..., Any]
else:  # Django's TaskContext is not subscriptable at run time
    _TaskContext = TaskContext


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


def _task_backend(alias: str) -> LeasingBackend:
    """The backend the item was enqueued through, as TASKS gives it now; a PermanentError
    if TASKS no longer has it, or no longer as a usable leasing backend."""
    from django.tasks import task_backends

    from .backend import LeasingBackend  # here: the backend's options import this module

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
    data = task_input(ctx.input)
    task = load_task(data["task"])
    args, kwargs = data["args"], data["kwargs"]
    check_arguments(task, data["task"], args, kwargs)
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
        output = _output(value, ctx.worker_id)
    except BaseException:
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        task_finished.send(type(backend), task_result=result)
        raise
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", output["return_value"])
    task_finished.send(type(backend), task_result=result)
    return output


def _output(value: Any, worker_id: str) -> dict[str, Any]:
    """The item's output for the task's return value, checked as the worker stores it, or
    `UnstorableOutput` (not retried: it would run again and return the same).

    normalize_json() takes what the item's JSON column refuses (NaN, a NUL, a lone
    surrogate, deeper than a payload may be, over MAX_PAYLOAD_BYTES): such a run reported
    SUCCESSFUL to task_finished before the worker failed it; and it recurses, so a value
    nested too deep (or containing itself) escaped as RecursionError, retried.
    """
    try:
        output = {"return_value": normalize_json(value), "worker_id": worker_id}
        validation.payload("it", output)
    except RecursionError:
        original = PayloadNotSerializable(
            f"it is nested more than {validation.MAX_JSON_DEPTH} levels deep (or contains itself)."
        )
        raise UnstorableOutput(
            f"the task's return value cannot be stored as JSON ({original}); not retried",
            original,
        ) from None
    except (TypeError, ValueError) as exc:  # PayloadNotSerializable, PayloadTooLarge too
        raise UnstorableOutput(
            f"the task's return value cannot be stored as JSON ({exc}); not retried", exc
        ) from exc
    return output
