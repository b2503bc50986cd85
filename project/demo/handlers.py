"""Demo handlers, autodiscovered by the leasing app (`make demo` runs them).

* `demo.sleep`: sleeps in small steps, beating after each one (beat mode: a
  handler that stops beating loses its lease);
* `demo.flaky`: fails on its first attempts, so the retries and the backoff show
  up in the dashboard, then succeeds;
* `demo.crunch`: works through a list in iterations, writing a checkpoint after
  each, and resumes from the last one when it is retried.
"""

from __future__ import annotations

import time
from typing import Any

from leasing import WorkContext, handler
from leasing.exceptions import PermanentError


@handler("demo.sleep", heartbeat="beat", lease_duration=30, heartbeat_interval=3)
def sleep(ctx: WorkContext) -> dict[str, Any]:
    seconds = float((ctx.input or {}).get("seconds", 1.0))
    steps = max(1, int(seconds / 0.1))
    for _ in range(steps):
        time.sleep(seconds / steps)
        ctx.beat()
    return {"slept": seconds}


@handler("demo.flaky", max_retries=3)
def flaky(ctx: WorkContext) -> dict[str, Any]:
    data = ctx.input or {}
    if data.get("permanent"):
        raise PermanentError("this input can never succeed")
    fail_times = int(data.get("fail_times", 1))
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"simulated failure on attempt {ctx.attempt}")
    return {"succeeded_on_attempt": ctx.attempt}


@handler("demo.crunch", lease_duration=60, heartbeat_interval=5)
def crunch(ctx: WorkContext) -> dict[str, Any]:
    numbers = list((ctx.input or {}).get("numbers", range(10)))
    state = ctx.resume_state() or {"index": 0, "total": 0}
    for index in range(state["index"], len(numbers)):
        ctx.checkpoint("iteration_start", {"index": index})
        state = {"index": index + 1, "total": state["total"] + numbers[index] ** 2}
        ctx.beat()
        ctx.checkpoint("iteration_end", state)
    return {"sum_of_squares": state["total"], "resumed_from": ctx.attempt > 1}
