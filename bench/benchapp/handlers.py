"""Work types of the benchmarks.

* `bench.noop`: does nothing and returns None, so a run measures the queue
  machinery (claim, start, complete) and nothing else.
* `bench.wait`: one `time.sleep(input["seconds"])` (default 5), the
  long-running item of the `longrun` scenario: only the worker's renewer
  keeps its lease, and thousands of them wait at once without waking.
* `bench.sleep`: sleeps `input["seconds"]` (default 60) in `thread` heartbeat
  mode, so only the worker's lease renewer keeps it alive: the recovery
  benchmark SIGKILLs a worker holding these.
"""

from __future__ import annotations

import time
from typing import Any

from leasing import WorkContext, handler


@handler("bench.noop")
def noop(ctx: WorkContext) -> None:
    return None


@handler("bench.sleep")
def sleep(ctx: WorkContext) -> Any:
    deadline = time.monotonic() + float((ctx.input or {}).get("seconds", 60))
    while time.monotonic() < deadline and not ctx.lease_lost:
        time.sleep(0.1)
    return {"slept": True}


@handler("bench.wait")
def wait(ctx: WorkContext) -> None:
    time.sleep(float((ctx.input or {}).get("seconds", 5)))
