"""One module per benchmark scenario: each has `run(bench) -> dict` and `rows(record)`.

`SCENARIOS` is the order `python -m bench.run` runs them in (`DEFAULT_SCENARIOS`
without --only); `machine` always runs first and is not in either.
"""

from __future__ import annotations

from types import ModuleType

from bench.scenarios import (
    burst,
    ceiling,
    claim,
    enqueue,
    fairness,
    fairstart,
    heartbeat,
    history,
    longrun,
    longtx,
    machine,
    options,
    peers,
    pickup,
    process_mode,
    ratelimit,
    recovery,
    signals,
    steady,
    sweep,
    throughput,
    tracing,
)

MODULES: dict[str, ModuleType] = {
    "enqueue": enqueue,
    "throughput": throughput,
    "ceiling": ceiling,
    "options": options,
    "signals": signals,
    "tracing": tracing,
    "burst": burst,
    "fairstart": fairstart,
    "longrun": longrun,
    "steady": steady,
    "longtx": longtx,
    "peers": peers,
    "claim": claim,
    "pickup": pickup,
    "recovery": recovery,
    "sweep": sweep,
    "heartbeat": heartbeat,
    "process_mode": process_mode,
    "history": history,
    "fairness": fairness,
    "ratelimit": ratelimit,
}
SCENARIOS: tuple[str, ...] = tuple(MODULES)
# What `python -m bench.run` runs unless --only says otherwise: loading
# 10,000,000 rows does not fit the 15 minutes of `make bench`.
DEFAULT_SCENARIOS: tuple[str, ...] = tuple(name for name in SCENARIOS if name != "history")
MACHINE = machine
