"""Handlers the test suite runs, in-process and in worker subprocesses.

`LEASING_TEST_RECORD` (a file path) makes handlers append one line per
execution, so tests can count how often each item really ran, across
processes.
"""

from __future__ import annotations

import os
import time
from typing import Any

from leasing.exceptions import PermanentError
from leasing.handlers import WorkContext, handler


def record(ctx: WorkContext, what: str = "ran") -> None:
    path = os.environ.get("LEASING_TEST_RECORD")
    if path:
        # O_APPEND writes of one short line are atomic across processes.
        with open(path, "a") as f:
            f.write(f"{ctx.lease.work_item_id} {ctx.lease.token} {what} {ctx.worker_id}\n")


@handler("test.noop")
def noop(ctx: WorkContext) -> None:
    record(ctx)
    return None


@handler("test.echo")
def echo(ctx: WorkContext) -> Any:
    record(ctx)
    return {"echo": ctx.input, "attempt": ctx.attempt}


@handler("test.fail_then_succeed")
def fail_then_succeed(ctx: WorkContext) -> Any:
    record(ctx)
    if ctx.attempt <= (ctx.input or {}).get("failures", 1):
        raise RuntimeError(f"planned failure {ctx.attempt}")
    return {"attempt": ctx.attempt}


@handler("test.always_fail")
def always_fail(ctx: WorkContext) -> Any:
    record(ctx)
    raise ValueError("this always fails")


@handler("test.permanent")
def permanent(ctx: WorkContext) -> Any:
    record(ctx)
    raise PermanentError("bad input, do not retry")


@handler("test.bad_output")
def bad_output(ctx: WorkContext) -> Any:
    return {"not json": object()}


@handler("test.sleep")
def sleep(ctx: WorkContext) -> Any:
    """Thread mode: sleeps without beating; the renewer keeps the lease."""
    record(ctx, "start")
    time.sleep(float((ctx.input or {}).get("seconds", 0.5)))
    record(ctx)
    return {"slept": True, "lease_lost": ctx.lease_lost}


@handler("test.beat_sleep", heartbeat="beat")
def beat_sleep(ctx: WorkContext) -> Any:
    """Beat mode: beats every `every` seconds for `seconds`; `every` 0 means never."""
    data = ctx.input or {}
    seconds, every = float(data.get("seconds", 1)), float(data.get("every", 0.1))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(every or 0.05)
        if every:
            ctx.beat()
    record(ctx)
    return {"lease_lost": ctx.lease_lost}


@handler("test.resumable")
def resumable(ctx: WorkContext) -> Any:
    """Counts to `n`, checkpointing each step; crashes once at `crash_at`."""
    data = ctx.input or {}
    state = ctx.resume_state() or {"i": 0}
    for i in range(state["i"], data.get("n", 5)):
        if i == data.get("crash_at") and ctx.attempt == 1:
            raise RuntimeError("crash mid-way")
        state = {"i": i + 1}
        ctx.checkpoint("iteration_end", state)
    return {"resumed_at": ctx.resume_state(), "attempt": ctx.attempt}
