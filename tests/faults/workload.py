"""What a fault run asks of leasing: its settings, its work types and the items it enqueues.

Short leases, so that every fault costs leases and the sweep is busy; retries
plentiful with a short backoff, so that items end within the settle time.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

QUEUE_LIMITS = {"limited": 2}
MAX_LEASE_LIFETIME = 60.0
# `faults.capped` runs may outlive their lease's cap: the worker times them out.
CAPPED_LIFETIME = 3.0
CAPS = {"faults.capped": CAPPED_LIFETIME}
SCHEDULE_NAME = "fault-tick"

LEASING: dict[str, Any] = {
    "LEASE_DURATION": 4,
    "HEARTBEAT_INTERVAL": 1,
    "HEARTBEAT_MAX_FAILURES": 3,
    "SWEEP_INTERVAL": 1,
    "POLL_INTERVAL": 0.3,
    "MAX_RETRIES": 12,
    "RETRY_BACKOFF_BASE": 0.25,
    "RETRY_BACKOFF_MAX": 2.0,
    "MAX_LEASE_LIFETIME": MAX_LEASE_LIFETIME,
    "QUEUE_LIMITS": QUEUE_LIMITS,
    "SCHEDULES": {
        SCHEDULE_NAME: {"work_type": "faults.tick", "every": 1, "queue": "ticks"},
    },
}

# Keys of unique items come from small pools, so that they collide often.
UNIQUE_KEYS = 4
# The most an expired lease may wait for the sweep (which passes every second)
# under these faults: a database restart, a killed sweep starting again.
RECOVERY_BOUND = 20.0


def batch(number: int, rng: random.Random, now: datetime, until: datetime) -> list[dict[str, Any]]:
    """The items of one producer batch enqueued at `now` (a parent's dependents are
    enqueued after it); none waits to run past `until`."""
    specs: list[dict[str, Any]] = [
        {
            "task_id": f"plain-{number}-{i}",
            "work_type": "faults.plain",
            "input_data": {"work": 0.05},
        }
        for i in range(3)
    ]
    specs.append(
        {"task_id": f"flaky-{number}", "work_type": "faults.flaky", "input_data": {"fail": 0.35}}
    )
    for scope, prefix in (("pending", "p"), ("unfinished", "f")):
        spec = {
            "task_id": f"unique-{scope}-{number}",
            "work_type": "faults.unique",
            "input_data": {"fail": 0.4, "work": 1.0},
            "unique_key": f"{prefix}{rng.randrange(UNIQUE_KEYS)}",
            "unique_while": scope,
        }
        if scope == "pending" and rng.random() < 0.5:
            # It holds its key while it waits to run, longer than the recovery bound
            # half the time: a running item of the key that comes back to pending
            # meanwhile (a failure, an expiry) must be superseded at once.
            wait = rng.uniform(1.0, 3.0) if rng.random() < 0.5 else rng.uniform(30.0, 45.0)
            # Never after the producer's end, so that the settle time need not wait.
            spec["run_after"] = min(now + timedelta(seconds=wait), until)
        specs.append(spec)
    specs.append(
        {
            "task_id": f"limited-{number}",
            "work_type": "faults.limited",
            "queue_name": "limited",
            "input_data": {"work": rng.uniform(0.2, 0.6)},
        }
    )
    if number % 3 == 0:
        specs.append(
            {"task_id": f"slow-{number}", "work_type": "faults.slow", "input_data": {"steps": 6}}
        )
    if number % 3 == 1:
        specs.append({"task_id": f"capped-{number}", "work_type": "faults.capped"})
    return specs


def dependency_group(number: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A parent that fails for good now and then (two retries), and two dependents
    that then fail with it."""
    parent = {
        "task_id": f"parent-{number}",
        "work_type": "faults.dep",
        "input_data": {"fail": 0.5},
        "max_retries": 2,
    }
    children = [
        {
            "task_id": f"child-{number}-{i}",
            "work_type": "faults.dep",
            "input_data": {"fail": 0.1},
            "on_dependency_failure": "fail",
        }
        for i in range(2)
    ]
    return parent, children
