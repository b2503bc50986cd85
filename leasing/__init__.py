"""Leasing: exactly-once-in-effect work items for Django.

    from leasing import enqueue, handler

The public API below is importable before and after `django.setup()`: each
name is resolved on first use (PEP 562), so importing this package never
touches settings or models.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it: what users call, and the exceptions they catch.
# Return types (ReleaseOutcome, PauseState) and the worker's embedding API
# (leasing.worker.WorkerRuntime, WorkerOptions: `runworker` is how a worker runs) are
# not repeated here; they stay importable from their modules.
_EXPORTS = {
    "enqueue": "leasing.services.enqueue",
    "enqueue_many": "leasing.services.enqueue",
    "Lease": "leasing.services.held",
    "LeaseManager": "leasing.services.leases",
    "handler": "leasing.handlers",
    "WorkContext": "leasing.context",
    "create_checkpoint": "leasing.services.checkpoints",
    "checkpoints_for": "leasing.services.checkpoints",
    "latest_checkpoint": "leasing.services.checkpoints",
    "resume_state": "leasing.services.checkpoints",
    "run_once": "leasing.services.idempotency",
    "apply_action": "leasing.services.operations",
    "cancel": "leasing.services.operations",
    "waiting_on": "leasing.services.dependencies",
    "dependents_of": "leasing.services.dependencies",
    "pause": "leasing.services.pauses",
    "resume": "leasing.services.pauses",
    "RecoverySweep": "leasing.sweep",
    "RecoveryStats": "leasing.sweep",
    "HeartbeatThread": "leasing.heartbeat",
    "Heartbeat": "leasing.heartbeat",
    "LeaseExtender": "leasing.heartbeat",
    "LeaseExtenderConfig": "leasing.heartbeat",
    "start_heartbeat": "leasing.heartbeat",
    "PermanentError": "leasing.exceptions",
    "Cancelled": "leasing.exceptions",
    "LeasingError": "leasing.exceptions",
    "signals": "leasing.signals",
    "InvalidInput": "leasing.exceptions",
    "LeaseLostError": "leasing.exceptions",
    "LeaseExpiredError": "leasing.exceptions",
    "LeaseConflictError": "leasing.exceptions",
    "UnknownWorkType": "leasing.exceptions",
    "UnknownDependency": "leasing.exceptions",
    "WorkItemNotFound": "leasing.exceptions",
    "IdempotencyConflict": "leasing.exceptions",
    "IdempotencyInProgress": "leasing.exceptions",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'leasing' has no attribute {name!r}")
    if module == f"leasing.{name}":  # a submodule exported as itself (leasing.signals)
        return importlib.import_module(module)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
