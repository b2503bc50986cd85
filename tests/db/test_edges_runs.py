"""A run that was superseded, or whose handler raised a BaseException, cannot do harm.

Real `runworker` processes: an item force-released (or recovered by the sweep)
and claimed again by the *same* process is a new run (a new token), and the
old run's completion is refused exactly as if another worker held the item.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from leasing import enqueue
from leasing.models import WorkItem
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)


def worker(spawn, record: Path, *extra: str, lease: float = 300) -> subprocess.Popen:
    leasing = leasing_env(HEARTBEAT_INTERVAL=0.2, LEASE_DURATION=lease)
    return spawn(
        "manage.py", "runworker", *extra, env={"LEASING_TEST_RECORD": str(record), **leasing}
    )


# The thread's death is the point: Python reports it through threading.excepthook.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_executor_thread_that_dies_hands_its_lease_back_and_is_replaced(monkeypatch):
    from leasing.worker import WorkerOptions, WorkerRuntime
    from leasing.worker.executors import ExecutorPool

    real = ExecutorPool.execute
    died: list[str] = []

    def dies_once(self, executor, slot):
        if not died:
            died.append(slot.lease.work_item_id)
            self.slots.start(slot, executor)  # it was running when the thread died
            raise SystemError("an executor thread dies for a reason of its own")
        return real(self, executor, slot)

    monkeypatch.setattr(ExecutorPool, "execute", dies_once)
    item = enqueue("orphan", "test.echo", {"n": 1})
    summary = WorkerRuntime(WorkerOptions(concurrency=1, burst=True, poll_interval=0.05)).run()
    assert died == [item.pk]
    row = WorkItem.objects.get(pk=item.pk)
    assert row.status == "completed" and row.retry_count == 0  # handed back, not a retry
    assert row.lease_token == 2
    assert summary.requeued == 1 and summary.completed == 1
