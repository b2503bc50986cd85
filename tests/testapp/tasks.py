"""Django Tasks used by tests/db/test_tasks.py (module level, as Django requires)."""

from __future__ import annotations

import time

from django.tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(priority=10, queue_name="urgent")
def urgent_echo(value: str) -> str:
    return value


@task(takes_context=True)
def with_context(context, n: int) -> dict:
    context.beat()
    context.checkpoint("manual_checkpoint", {"n": n})
    return {"attempt": context.attempt, "lease_lost": context.lease_lost}


@task
def explode() -> None:
    raise ValueError("kaboom")


@task
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


@task
async def async_double(x: int) -> int:
    return x * 2


# Every run of `returns_unstorable`, by its argument (a side effect that must not repeat).
RUNS: list[str] = []


@task
def returns_unstorable(kind: str) -> object:
    import datetime
    import decimal

    RUNS.append(kind)
    return {
        "datetime": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        "set": {1, 2},
        "decimal": decimal.Decimal("1.5"),
    }[kind]
