"""A handler's `timeout` is the most one run may take: an item of a timed type claimed ahead
(prefetched) waits in its worker's queue without that wait counting against its timeout,
and a run that really outlives its timeout is still stopped and retried.

test.stuck has `timeout=2`; with {"seconds": s} it returns after s seconds (at once for 0).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from leasing import enqueue, enqueue_many
from leasing.models import WorkItem
from tests.support.helpers import row, wait_for
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = timedelta(seconds=2)  # test.stuck's


def _burst(spawn, **leasing: object):
    env = {"LEASING_LOG_LEVEL": "INFO", **leasing_env(**leasing)}
    return spawn(
        "manage.py",
        "runworker",
        "--burst",
        "--concurrency",
        "1",
        "--work-type",
        "test.stuck",
        env=env,
    )


def test_timed_items_waiting_behind_quick_ones_run_whole_and_the_worker_exits_0(spawn):
    """The probe's scenario: quick items teach the worker to claim far ahead, then slow ones
    of the same timed type wait behind each other. Each takes well under its timeout, so
    none may time out, lose an attempt or count as an abandoned run, however long it waited."""
    quick = enqueue_many(
        [{"task_id": f"q{i}", "work_type": "test.stuck", "input_data": {"seconds": 0}}
         for i in range(200)]
    )  # fmt: skip
    slow = enqueue_many(
        [{"task_id": f"s{i}", "work_type": "test.stuck", "input_data": {"seconds": 0.8},
          "max_retries": 1}
         for i in range(4)]
    )  # fmt: skip
    proc = _burst(spawn)
    _out, err = proc.communicate(timeout=120)

    assert proc.returncode == 0, err
    assert "stopped (burst-done)" in err and "timed out 0," in err, err
    items = WorkItem.objects.filter(pk__in=[i.pk for i in [*quick, *slow]])
    assert set(items.values_list("status", "retry_count")) == {("completed", 0)}, err
    assert "Timed out" not in err and "abandoned the run" not in err, err


def test_a_run_that_waited_gets_its_whole_timeout_and_is_still_stopped_past_it(spawn):
    """One item runs 1.2 s; the next, claimed with it (PREFETCH), waits for it, then outlives
    its timeout. Its lease's clock starts when it starts, in the database too: acquired
    then, its deadline its timeout later (what the sweep and the console read), and the
    time-out still ends it, retried as before, then failed for good."""
    first = enqueue("first", "test.stuck", {"seconds": 1.2}, priority=1)
    stuck = enqueue("stuck", "test.stuck", {"seconds": 5}, max_retries=1)
    # A burst waits for a retry due within a poll.
    proc = _burst(spawn, PREFETCH=1, RETRY_BACKOFF_BASE=0.1, POLL_INTERVAL=0.5)
    try:

        def running_on_its_own_clock() -> bool:
            claimed_at = row(first.pk)["lease_acquired_at"]
            now = row(stuck.pk)
            return (
                claimed_at is not None
                and (now["status"], now["lease_token"]) == ("in_progress", 1)
                and now["lease_acquired_at"] - claimed_at >= timedelta(seconds=1.0)
            )

        # Both were claimed by one statement (one clock); its wait moved the second's.
        wait_for(running_on_its_own_clock, timeout=30, interval=0.01)
        moved = row(stuck.pk)
        assert moved["lease_deadline_at"] - moved["lease_acquired_at"] == TIMEOUT
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert row(first.pk)["status"] == "completed"
    ended = row(stuck.pk)
    assert (ended["status"], ended["retry_count"]) == ("failed", 1), err
    assert ended["error_message"].startswith("Timed out after 2 s"), ended["error_message"]
    assert "attempt 1/2 failed with timed out after 2 s" in err, err
