"""The fault run's work types. Every effect is one `ha_ledger` row written through
`run_once(atomic=True)` (`tests.ha.app.handlers.effect`), keyed by the item (and
step): the checker counts rows per key. Every handler returns its run's stamp,
`{"token", "worker"}`: the stored output then says which run completed the item.
"""

from __future__ import annotations

import random
import time
from typing import Any

from leasing import WorkContext, handler
from tests.ha.app.handlers import effect

from ..workload import CAPPED_LIFETIME


class PlannedFailure(Exception):
    """A handler's failure on purpose (retried while retries are left)."""


def stamp(ctx: WorkContext) -> dict[str, Any]:
    return {"token": ctx.lease.token, "worker": ctx.worker_id}


def work(ctx: WorkContext, default: float = 0.05) -> None:
    time.sleep(float(ctx.input.get("work", default)) if ctx.input else default)


def maybe_fail(ctx: WorkContext) -> None:
    rate = float((ctx.input or {}).get("fail", 0))
    if random.random() < rate:
        raise PlannedFailure(f"attempt {ctx.attempt} failed on purpose")


@handler("faults.plain")
def plain(ctx: WorkContext) -> dict[str, Any]:
    effect(ctx, f"plain:{ctx.lease.work_item_id}")
    work(ctx)
    return stamp(ctx)


def two_effects_and_a_chance_to_fail(ctx: WorkContext, kind: str) -> dict[str, Any]:
    """An effect, then maybe a failure, then a second effect: a retry must not repeat
    the first, and an item that completes has both."""
    item = ctx.lease.work_item_id
    effect(ctx, f"{kind}-a:{item}")
    work(ctx)
    maybe_fail(ctx)
    effect(ctx, f"{kind}-b:{item}")
    return stamp(ctx)


@handler("faults.flaky")
def flaky(ctx: WorkContext) -> dict[str, Any]:
    return two_effects_and_a_chance_to_fail(ctx, "flaky")


@handler("faults.unique")
def unique(ctx: WorkContext) -> dict[str, Any]:
    return two_effects_and_a_chance_to_fail(ctx, "unique")


@handler("faults.dep")
def dependent(ctx: WorkContext) -> dict[str, Any]:
    return two_effects_and_a_chance_to_fail(ctx, "dep")


@handler("faults.limited")
def limited(ctx: WorkContext) -> dict[str, Any]:
    effect(ctx, f"limited:{ctx.lease.work_item_id}")
    work(ctx, 0.4)
    return stamp(ctx)


@handler("faults.slow")
def slow(ctx: WorkContext) -> dict[str, Any]:
    """Steps of work longer than a lease in all: heartbeats keep it, kills cost it;
    each step is an effect and a checkpoint, and a new run resumes after the last."""
    item = ctx.lease.work_item_id
    state = ctx.resume_state() or {"step": 0}
    for step in range(int(state["step"]), int(ctx.input["steps"])):
        effect(ctx, f"slow:{item}:{step}")
        ctx.checkpoint("iteration_end", {"step": step + 1})
        time.sleep(0.8)
    return stamp(ctx)


@handler("faults.capped", max_lease_lifetime=CAPPED_LIFETIME, max_retries=12)
def capped(ctx: WorkContext) -> dict[str, Any]:
    """Its first runs often outlive the lease's cap (the worker times them out and their
    late result must be refused); later ones fit."""
    effect(ctx, f"capped:{ctx.lease.work_item_id}")
    longest = CAPPED_LIFETIME * 1.7 if ctx.attempt <= 2 else CAPPED_LIFETIME / 3
    time.sleep(random.uniform(0.2, longest))
    return stamp(ctx)


@handler("faults.tick")
def tick(ctx: WorkContext) -> dict[str, Any]:
    effect(ctx, f"tick:{ctx.input['_schedule']['tick']}")
    return stamp(ctx)
