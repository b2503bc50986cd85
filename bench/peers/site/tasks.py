"""One no-op task per peer (procrastinate finds this module by autodiscovery)."""

from __future__ import annotations

from django.tasks import task
from procrastinate.contrib.django import app


@app.task(name="bench_noop")
def procrastinate_noop() -> None:
    return None


@task()
def tasks_db_noop() -> None:
    return None


def q_noop() -> None:
    return None
