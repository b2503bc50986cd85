"""Handlers of the HA tests. Their side effects land in the `ha_ledger` table.

The ledger row is written by the function given to `run_once(atomic=True)`,
in the transaction that records the key's response: the test counts rows per
effect key to prove each effect happened once.

`HA_EVENTS` (a file path) makes handlers append one JSON line per event they
observe (a step done, the lease seen lost, a write refused), so a test can
follow a process that cannot reach the database.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from django.db import connections

from leasing import WorkContext, handler
from leasing.exceptions import LeaseLostError

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS ha_ledger (
    id bigserial PRIMARY KEY,
    effect_key text NOT NULL,
    work_item_id text NOT NULL,
    lease_token bigint NOT NULL,
    worker_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def event(ctx: WorkContext, what: str, **fields: Any) -> None:
    path = os.environ.get("HA_EVENTS")
    if not path:
        return
    line = json.dumps(
        {
            "at": time.time(),
            "event": what,
            "item": ctx.lease.work_item_id,
            "token": ctx.lease.token,
            "worker": ctx.worker_id,
            **fields,
        }
    )
    # O_APPEND writes of one short line are atomic across processes.
    with open(path, "a") as f:
        f.write(line + "\n")


def effect(ctx: WorkContext, key: str) -> Any:
    """The side effect: one ledger row, run through the idempotency key `key`."""

    def write() -> dict[str, int]:
        with connections[ctx.using].cursor() as cursor:
            cursor.execute(
                "INSERT INTO ha_ledger (effect_key, work_item_id, lease_token, worker_id) "
                "VALUES (%s, %s, %s, %s) RETURNING id",
                [key, ctx.lease.work_item_id, ctx.lease.token, ctx.worker_id],
            )
            return {"ledger_id": cursor.fetchone()[0]}

    # The effect is a row in the same database: recorded in one transaction with
    # its key, so a crash between the two can never run it twice.
    return ctx.run_once(key, {"key": key}, write, atomic=True)


def record_run(ctx: WorkContext) -> None:
    """One line per execution in the file `HA_RUNS` (to count runs without a database write)."""
    path = os.environ.get("HA_RUNS")
    if path:
        with open(path, "a") as f:
            f.write(f"{ctx.lease.work_item_id} {ctx.lease.token} {ctx.worker_id}\n")


@handler("ha.effect", max_retries=20)
def one_effect(ctx: WorkContext) -> Any:
    """Input `effect` (default true: one run_once effect), `sleep` (seconds of work after
    it) and `checkpoint` (an iteration_end checkpoint at the end)."""
    record_run(ctx)
    result = effect(ctx, f"effect:{ctx.lease.task_id}") if ctx.input.get("effect", True) else None
    if ctx.input.get("sleep"):
        time.sleep(float(ctx.input["sleep"]))
    if ctx.input.get("checkpoint"):
        ctx.checkpoint("iteration_end", {"done": True})
    return result


@handler("ha.steps", max_retries=20)
def steps(ctx: WorkContext) -> Any:
    """`steps` effects, each followed by an `iteration_end` checkpoint.

    On its first lease (token 1) the handler computes for `pause` seconds after
    step `pause_after` without touching the database, waiting on the lease-lost
    signal: the test cuts the host's link then, and the handler must learn from
    the worker that its lease is gone, and then be refused any write.
    """
    state = ctx.resume_state() or {"step": 0}
    event(ctx, "started", step=state["step"])
    while state["step"] < int(ctx.input["steps"]):
        step = state["step"]
        effect(ctx, f"step:{ctx.lease.task_id}:{step}")
        state = {"step": step + 1}
        ctx.checkpoint("iteration_end", state)
        event(ctx, "step_done", step=step)
        if ctx.lease.token == 1 and step == int(ctx.input.get("pause_after", -1)):
            event(ctx, "pausing")
            if ctx.wait_lease_lost(float(ctx.input.get("pause", 60))):
                event(ctx, "lease_lost_seen", reason=ctx.lease_lost_reason)
                try:
                    ctx.checkpoint("iteration_end", {"step": -1, "zombie": True})
                except LeaseLostError as exc:
                    event(ctx, "write_refused", error=str(exc))
                    raise
                event(ctx, "write_accepted")  # the test fails on this line's presence
                raise LeaseLostError("lease lost")
    return state
