"""A receiver on every lease lifecycle signal, as a user's metrics hook would be."""

from __future__ import annotations

import atexit
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from leasing import signals

RECEIVED: Counter[str] = Counter()

SIGNALS = {
    "lease_acquired": signals.lease_acquired,
    "lease_renewed": signals.lease_renewed,
    "heartbeat": signals.heartbeat,
    "lease_released": signals.lease_released,
    "lease_expired": signals.lease_expired,
    "lease_force_released": signals.lease_force_released,
}


def _count(name: str) -> Any:
    def receiver(sender: type, **kwargs: Any) -> None:
        RECEIVED[name] += 1

    return receiver


_RECEIVERS = {name: _count(name) for name in SIGNALS}


def connect_all() -> None:
    for name, signal in SIGNALS.items():
        signal.connect(_RECEIVERS[name], dispatch_uid=f"bench.{name}")
    # What this process received, for the scenario to check that it listened.
    counts_dir = os.environ.get("BENCH_SIGNAL_COUNTS")
    if counts_dir:
        atexit.register(_write_counts, Path(counts_dir) / f"{os.getpid()}.json")


def _write_counts(path: Path) -> None:
    path.write_text(json.dumps(dict(RECEIVED)))
