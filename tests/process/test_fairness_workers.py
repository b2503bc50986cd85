"""Fair claims with real worker processes, on both databases (on SQLite, two workers sharing
one file): a tenant's few items are not held back by another tenant's backlog.

Tenant A has 3,000 items waiting in a fair queue; two `runworker` processes
start on it, and then tenant B enqueues 20 items. Every one of B's
items starts while A's backlog is still far from drained, and within a second
of its enqueue (the bench scenario `fairness` measures the p99 behind
200,000). A second run without FAIR_QUEUES shows the difference: B's items
wait behind A's backlog.
"""

from __future__ import annotations

import time

import pytest

from leasing import enqueue_many
from leasing.models import WorkItem
from tests.support.helpers import wait_for
from tests.support.workers import start_workers, stop_workers

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 3_000
TENANT_B = 20


def _run(subprocess_env, log_path, *, fair: bool) -> tuple[int, float]:
    """A's items started when B's last one started, and B's slowest enqueue-to-start."""
    spec = {"work_type": "test.sleep", "input_data": {"seconds": 0.02}, "queue_name": "fair"}
    enqueue_many(
        [
            {**spec, "task_id": f"a-{i}", "fairness_key": "a" if fair else None}
            for i in range(BACKLOG)
        ]
    )
    leasing = {"FAIR_QUEUES": ["fair"]} if fair else {}
    with open(log_path, "wb") as log:
        workers = start_workers(2, subprocess_env, log, concurrency=4, leasing=leasing)
        try:
            wait_for(lambda: WorkItem.objects.filter(started_at__isnull=False).exists(), 120)
            enqueue_many(
                [
                    {**spec, "task_id": f"b-{i}", "fairness_key": "b" if fair else None}
                    for i in range(TENANT_B)
                ]
            )
            b_items = WorkItem.objects.filter(task_id__startswith="b-")
            wait_for(lambda: not b_items.filter(started_at__isnull=True).exists(), 300, 0.1)
        finally:
            stop_workers(workers)
    last_b = max(b_items.values_list("started_at", flat=True))
    a_before = WorkItem.objects.filter(task_id__startswith="a-", started_at__lt=last_b).count()
    slowest = max((i.started_at - i.created_at).total_seconds() for i in b_items)
    return a_before, slowest


def test_a_tenant_s_items_start_ahead_of_another_s_backlog(subprocess_env, tmp_path):
    a_before, slowest = _run(subprocess_env, tmp_path / "fair.log", fair=True)
    print(
        f"\nfair: {a_before} of A's {BACKLOG} started before B's last; B's slowest {slowest:.3f} s"
    )
    assert a_before < BACKLOG // 2, a_before
    assert slowest < 1.0, slowest


def test_without_fair_queues_the_backlog_goes_first(subprocess_env, tmp_path):
    started = time.monotonic()
    a_before, slowest = _run(subprocess_env, tmp_path / "plain.log", fair=False)
    print(
        f"\nplain: {a_before} of A's {BACKLOG} started before B's last; B's slowest "
        f"{slowest:.3f} s ({time.monotonic() - started:.1f} s)"
    )
    assert a_before > BACKLOG * 0.9, a_before
