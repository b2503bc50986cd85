"""`runworker --burst` takes what is claimable now and exits; it waits only for work that
is due within a poll (a retry's short backoff), not for a rate limit's next opening."""

from __future__ import annotations

import pytest

from leasing import enqueue
from leasing.models import WorkItem
from leasing.worker import WorkerOptions, WorkerRuntime

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_burst_exits_when_what_is_left_waits_on_a_rate_limit_longer_than_a_poll(
    leasing_settings,
):
    """A bucket of one a day: the burst ran the first item and then polled every 50 ms
    for a day, never exiting."""
    leasing_settings(RATE_LIMITS={"queue:daily": {"limit": 1, "per": 86400, "burst": 1}})
    items = [enqueue(f"t{i}", "test.echo", queue_name="daily") for i in range(2)]
    other = enqueue("other", "test.echo")
    summary = WorkerRuntime(WorkerOptions(concurrency=1, burst=True, poll_interval=0.2)).run()
    assert summary.reason == "burst-done"
    assert summary.completed == 2
    statuses = sorted(WorkItem.objects.filter(pk__in=[i.pk for i in items]).values_list(
        "status", flat=True))  # fmt: skip
    assert statuses == ["completed", "pending"]
    assert WorkItem.objects.get(pk=other.pk).status == "completed"


def test_a_burst_waits_for_a_rate_limit_that_opens_within_a_poll(leasing_settings):
    leasing_settings(RATE_LIMITS={"queue:fast": {"limit": 20, "per": 1, "burst": 1}})
    items = [enqueue(f"t{i}", "test.echo", queue_name="fast") for i in range(5)]
    summary = WorkerRuntime(WorkerOptions(concurrency=1, burst=True, poll_interval=0.5)).run()
    assert summary.reason == "burst-done" and summary.completed == 5
    assert set(WorkItem.objects.filter(pk__in=[i.pk for i in items]).values_list(
        "status", flat=True)) == {"completed"}  # fmt: skip
