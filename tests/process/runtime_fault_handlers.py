"""Handlers that meet a fault of the worker's runtime, for
tests/process/test_worker_runtime_faults.py; registered through LEASING['HANDLERS'] in
the worker it starts."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from leasing import WorkContext
from leasing.exceptions import LeaseLostError
from leasing.worker.renewer import LeaseRenewer


def until_released(ctx: WorkContext) -> Any:
    """Waits for the file ctx.input['release'], then writes a checkpoint (refused once its
    item is gone) and raises what it got, or returns (ctx.input['ending'] == 'return')."""
    Path(ctx.input["started"]).write_text("started\n")
    release = Path(ctx.input["release"])
    while not release.exists():
        time.sleep(0.02)
    try:
        ctx.checkpoint("iteration_end", {"i": 1})
    except LeaseLostError:
        if ctx.input["ending"] == "raise":
            raise
    return {"ended": ctx.input["ending"]}


def end_the_renewer(ctx: WorkContext) -> Any:
    """Ends its worker's lease renewer thread, as a fault of the renewer would."""
    # The renewer's thread runs its `_run`: the renewer is that method's object.
    targets = [getattr(t, "_target", None) for t in threading.enumerate()]
    renewers = [
        target.__self__
        for target in targets
        if isinstance(getattr(target, "__self__", None), LeaseRenewer)
    ]
    assert len(renewers) == 1, threading.enumerate()
    renewers[0].stop(wait=False)
    return {"renewer": "ended"}
