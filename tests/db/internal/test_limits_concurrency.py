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

import pytest
from django.db import connection, transaction

from leasing import LeaseManager, enqueue_many
from leasing.models import WorkItem
from leasing.services.terms import claim_terms
from leasing.sql.limits import Limits
from leasing.sql.terms import ClaimFilters
from leasing.storage import storage_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LIMIT = 3


def test_a_claim_waits_for_a_concurrent_limited_claim_to_commit_and_then_counts_it(
    leasing_settings,
):
    """The advisory lock, deterministically: without it the second claimer's snapshot
    would not see the first one's uncommitted claims and would take 3 more."""
    leasing_settings(QUEUE_LIMITS={"lim": LIMIT})
    enqueue_many(
        [{"task_id": f"l-{i}", "work_type": "test.noop", "queue_name": "lim"} for i in range(10)]
    )
    limits = Limits((("lim", LIMIT),), ())
    first_claimed, release = threading.Event(), threading.Event()
    results: dict[str, int] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                storage = storage_for()
                statement = storage.claim("first", 10, claim_terms(None), ClaimFilters(), limits)
                # The limits' lock is held until this transaction commits.
                results["first"] = len(storage.run_claim(statement, limits))
                first_claimed.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    def second() -> None:
        try:
            results["second"] = len(LeaseManager("second").acquire_leases(10))
        finally:
            connection.close()

    a = threading.Thread(target=first)
    a.start()
    assert first_claimed.wait(timeout=30)
    b = threading.Thread(target=second)
    b.start()
    b.join(timeout=1.0)
    blocked = b.is_alive()
    release.set()
    a.join(timeout=30)
    b.join(timeout=30)
    assert results == {"first": LIMIT, "second": 0}
    assert blocked, "the second claim did not wait for the first one's lock"
    assert WorkItem.objects.filter(status="in_progress").count() == LIMIT
