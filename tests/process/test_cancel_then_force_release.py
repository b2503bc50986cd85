"""A running item asked to stop, then force-released because its worker looks stuck, ends
cancelled and does not run again, with a real `runworker` (process execution, so the
force-release stops the handler's child and frees the worker's one slot).

Runs on the test database (SQLite and PostgreSQL).
"""

from __future__ import annotations

import pytest

from leasing import cancel, enqueue
from leasing.services.operations import Action, apply_action
from tests.process.test_process_mode import first_start, started, stop, worker
from tests.support.helpers import process_running, row, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# A grace long enough that the cancel alone does not stop the child before the
# force-release does; the shutdown timeout stays above it (leasing.W006).
GRACE = 30.0


def test_an_item_asked_to_stop_then_force_released_ends_cancelled_and_never_runs_again(
    spawn, tmp_path
):
    record = tmp_path / "runs.txt"
    item = enqueue("p", "test.process_hang", max_retries=0)
    proc = worker(
        spawn,
        record,
        "--concurrency",
        "1",
        PROCESS_STOP_GRACE=GRACE,
        SHUTDOWN_TIMEOUT=GRACE + 5,
    )
    try:
        _, token, pid = first_start(record)
        asked = cancel(item.pk, actor="alice", reason="customer closed the account")
        assert asked.applied and asked.new_status == "in_progress", asked
        result = apply_action(
            Action.FORCE_RELEASE, item.pk, expected_token=token, actor="bob", reason="stuck"
        )
        assert result.applied, result
        # The worker finds its lease gone and stops the child: its one slot is free.
        wait_for(lambda: not process_running(pid), timeout=20)
        # Work enqueued after it runs; had the item gone back to pending it would have
        # been claimed first (older) and hung in that slot, and this would never run.
        after = enqueue("q", "test.noop")
        wait_for(lambda: row(after.pk)["status"] == "completed", timeout=60)
        assert result.new_status == row(item.pk)["status"] == "cancelled", result
        assert [run[1] for run in started(record)] == [token]  # one run only
    finally:
        stop(proc)
