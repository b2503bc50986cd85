"""The worker runtime behind `python manage.py runworker`.

    from leasing.worker import WorkerOptions, WorkerRuntime

    summary = WorkerRuntime(WorkerOptions(concurrency=4, burst=True)).run()

Modules: `options` (what a worker is told, resolved once against the
settings), `runtime` (the dispatcher loop and shutdown), `executors` (handler
threads), `slots` (runs in flight, keyed by lease), `outcomes` (writing how
runs ended), `renewer` (keeping leases alive), `listener` (NOTIFY),
`stopping` (SIGTERM/SIGINT).
"""

from .options import WorkerConfig, WorkerOptions, resolve
from .outcomes import WorkerSummary
from .runtime import WorkerRuntime

__all__ = ["WorkerConfig", "WorkerOptions", "WorkerRuntime", "WorkerSummary", "resolve"]
