"""A Django Tasks backend on leasing.

    TASKS = {"default": {"BACKEND": "leasing.tasks.LeasingBackend", "QUEUES": []}}

`@task` functions enqueue as work items of type `django.task` and `runworker`
runs them with everything a handler gets: a fenced lease, heartbeats, retries
with backoff, recovery after a crash. `get_result()` reads the item and its
`error_boundary` checkpoints: status, timestamps, errors with tracebacks,
`worker_ids` (one per attempt) and the return value.

OPTIONS: `DATABASE` (alias, default "default"; another one is served by `runworker
--database ALIAS`, leasing.W011), `MAX_RETRIES` (default
`LEASING["MAX_RETRIES"]`; 0 gives Django's run-once semantics),
`LEASE_DURATION` and `HEARTBEAT` ("thread" or "beat") for the task handler
(one handler: the first leasing backend's). A bad or unknown option, or a second
leasing backend setting the handler's differently, is leasing.E013, never an
exception at start-up.
A task taking context gets a `LeasingTaskContext` with `beat()` and
`checkpoint()`.

* `backend`: `LeasingBackend` (enqueue, get_result, its system check);
* `options`: the OPTIONS' checks (leasing.E013) and the handler's registration;
* `running`: `run_task`, the handler `runworker` calls, and `LeasingTaskContext`;
* `stored`: what an item stores, and the task it names, loaded as the code is now.

This package imports without the leasing models, so that a site that forgot
INSTALLED_APPS gets the system check (leasing.E005) instead of a RuntimeError.
"""

from .backend import LeasingBackend
from .options import register_task_handler, uses_leasing_backend
from .running import LeasingTaskContext, run_task
from .stored import BACKEND_PATH, TASK_WORK_TYPE

__all__ = [
    "BACKEND_PATH",
    "TASK_WORK_TYPE",
    "LeasingBackend",
    "LeasingTaskContext",
    "register_task_handler",
    "run_task",
    "uses_leasing_backend",
]
