"""One module per benchmark scenario: each has `run(bench) -> dict` and `rows(record)`.

`SCENARIOS` is the order `python -m bench.run` runs them in; `machine` always
runs first and is not in it.
"""

from __future__ import annotations

from types import ModuleType

from bench.scenarios import (
    burst,
    ceiling,
    claim,
    enqueue,
    fairstart,
    heartbeat,
    longrun,
    longtx,
    machine,
    options,
    peers,
    pickup,
    recovery,
    steady,
    sweep,
    throughput,
)

MODULES: dict[str, ModuleType] = {
    "enqueue": enqueue,
    "throughput": throughput,
    "ceiling": ceiling,
    "options": options,
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
}
SCENARIOS: tuple[str, ...] = tuple(MODULES)
MACHINE = machine
