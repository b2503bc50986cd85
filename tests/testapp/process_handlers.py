"""Handlers in process execution, for tests/process/test_process_mode.py (imported by
tests/testapp/handlers.py only when LEASING_TEST_PROCESS_HANDLERS=1). Each records its
start with its child's pid."""

from __future__ import annotations

import os
import time
from typing import Any

from leasing import WorkContext, handler
from tests.testapp.handlers import record


def record_pid(ctx: WorkContext, what: str) -> None:
    record(ctx, f"{what} pid={os.getpid()}")


@handler("test.process_sleep", execution="process", timeout=2, max_retries=1)
def process_sleep(ctx: WorkContext) -> Any:
    """Blocks in one call that never returns (retried after its timeout, by its policy)."""
    record_pid(ctx, "start")
    time.sleep(3600)
    return {"woke": True}


@handler("test.process_spin", execution="process", timeout=2, on_lease_expired="fail")
def process_spin(ctx: WorkContext) -> Any:
    """Spins in pure Python, never beating (failed after its timeout, by its policy)."""
    record_pid(ctx, "start")
    n = 0
    while True:
        n += 1


@handler("test.process_hang", execution="process", max_retries=0)
def process_hang(ctx: WorkContext) -> Any:
    """No timeout: only a force-release, a cancel or a lost lease stops it."""
    record_pid(ctx, "start")
    time.sleep(3600)
    return {"woke": True}


@handler("test.process_work", execution="process", heartbeat="beat")
def process_work(ctx: WorkContext) -> Any:
    """Checkpoints, a `run_once` and proof-of-work beats, from a child; returns its pid."""
    record_pid(ctx, "start")
    data = ctx.input or {}
    state = ctx.resume_state() or {"i": 0}
    for i in range(state["i"], int(data.get("n", 3))):
        ctx.checkpoint("iteration_end", {"i": i + 1})
        ctx.beat()
    effect = ctx.run_once(
        f"effect:{ctx.lease.work_item_id}", {"n": data.get("n", 3)}, lambda: {"pid": os.getpid()}
    )
    deadline = time.monotonic() + float(data.get("beat_for", 0))
    while time.monotonic() < deadline:  # outlives its lease only if the beats extend it
        time.sleep(0.05)
        ctx.beat()
    return {"pid": os.getpid(), "effect": effect, "attempt": ctx.attempt}


@handler("test.process_exit", execution="process", max_retries=0)
def process_exit(ctx: WorkContext) -> Any:
    """Ends its process without a word, as a crash in native code would."""
    record_pid(ctx, "start")
    os._exit(7)


@handler("test.process_stubborn", execution="process", max_retries=0)
def process_stubborn(ctx: WorkContext) -> Any:
    """Ignores the worker's SIGTERM (the SystemExit it raises here): only SIGKILL, after
    PROCESS_STOP_GRACE, stops it."""
    record_pid(ctx, "start")
    while True:
        try:
            time.sleep(3600)
        except SystemExit:
            continue
