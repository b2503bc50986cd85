"""LeaseManager semantics on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from leasing import Lease, LeaseManager, enqueue, enqueue_many
from leasing.exceptions import (
    InvalidDuration,
    InvalidInput,
    LeaseConflictError,
    LeaseExpiredError,
    LeaseLostError,
    PayloadNotSerializable,
    PayloadTooLarge,
    WorkItemNotFound,
)
from leasing.models import WorkItem
from leasing.services.completion import complete, complete_and_claim
from leasing.services.terms import claim_terms
from leasing.sql.terms import ClaimFilters
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db(transaction=True)


def snapshot(item_id: str) -> dict:
    return WorkItem.objects.filter(pk=item_id).values().get()


def expire_now(item_id: str) -> None:
    """Move a lease's expiry into the past without waiting for it."""
    WorkItem.objects.filter(pk=item_id).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )


# --- claiming ----------------------------------------------------------------------------


def test_claim_sets_lease_fields_from_the_database_clock(make_items):
    [item] = make_items(1)
    before = database_now()
    lease = LeaseManager("w1").acquire_lease(lease_duration_seconds=120)
    after = database_now()

    assert isinstance(lease, Lease)
    assert lease.work_item_id == item.work_item_id
    assert lease.token == 1
    row = snapshot(item.work_item_id)
    assert row["status"] == "in_progress"
    assert row["lease_holder"] == "w1"
    assert row["lease_token"] == 1
    assert before <= row["lease_acquired_at"] <= after
    assert row["started_at"] == row["lease_acquired_at"] == row["heartbeat_at"]
    assert row["lease_expires_at"] - row["lease_acquired_at"] == timedelta(seconds=120)
    assert lease.expires_at == row["lease_expires_at"]


def test_nothing_claimable_returns_none(db):
    assert LeaseManager("w1").acquire_lease() is None
    assert LeaseManager("w1").acquire_leases(5) == []


def test_claims_by_priority_then_age(make_items):
    low_old = make_items(1, priority=0)[0]
    high = make_items(1, priority=5)[0]
    low_new = make_items(1, priority=0)[0]
    top = make_items(1, priority=9)[0]
    manager = LeaseManager("w1")
    order = [manager.acquire_lease().work_item_id for _ in range(4)]
    assert order == [top.pk, high.pk, low_old.pk, low_new.pk]


def test_acquire_leases_returns_a_batch_in_claim_order(make_items):
    items = make_items(5, priority=1)
    urgent = make_items(1, priority=3)[0]
    leases = LeaseManager("w1").acquire_leases(4)
    assert [lease.work_item_id for lease in leases] == [urgent.pk] + [i.pk for i in items[:3]]
    assert WorkItem.objects.in_progress().count() == 4
    assert WorkItem.objects.pending().count() == 2


def test_run_after_in_the_future_is_not_claimed(db):
    later = enqueue("t", "noop", run_after=database_now() + timedelta(hours=1))
    due = enqueue("t", "noop", run_after=database_now() - timedelta(seconds=1))
    manager = LeaseManager("w1")
    assert manager.acquire_lease().work_item_id == due.pk
    assert manager.acquire_lease() is None
    assert snapshot(later.pk)["status"] == "pending"


def test_work_type_task_and_queue_filters(db):
    a = enqueue("task-a", "email", queue_name="mail")
    b = enqueue("task-b", "resize", queue_name="images")
    c = enqueue("task-c", "email", queue_name="default")
    m = LeaseManager("w1")
    assert m.acquire_lease(work_type_filter="resize").work_item_id == b.pk
    assert m.acquire_lease(task_id_filter="task-c").work_item_id == c.pk
    assert m.acquire_lease(queue_filter=["images", "default"]) is None
    assert m.acquire_lease(work_type_filter=["email"], queue_filter="mail").work_item_id == a.pk


def test_each_claim_increments_the_token(make_items):
    [item] = make_items(1)
    m = LeaseManager("w1")
    first = m.acquire_lease()
    m.requeue_lease(item.pk)
    second = m.acquire_lease()
    assert (first.token, second.token) == (1, 2)
    assert snapshot(item.pk)["retry_count"] == 0  # a requeue is not a retry


# --- renewing ----------------------------------------------------------------------------


def test_renew_extends_from_now(make_items):
    [item] = make_items(1)
    m = LeaseManager("w1")
    lease = m.acquire_lease(lease_duration_seconds=5)
    time.sleep(0.05)
    assert m.renew_lease(item.pk, lease_duration_seconds=600) is True
    row = snapshot(item.pk)
    assert row["lease_expires_at"] - row["heartbeat_at"] == timedelta(seconds=600)
    assert row["heartbeat_at"] > lease.acquired_at
    assert m.lease_for(item.pk).expires_at == row["lease_expires_at"]


def test_renew_records_progress_in_database_time(make_items):
    [item] = make_items(1)
    m = LeaseManager("w1")
    m.acquire_lease()
    m.renew_lease(item.pk, progress_age_seconds=10)
    row = snapshot(item.pk)
    assert row["heartbeat_at"] - row["progress_at"] == timedelta(seconds=10)


def test_renew_after_expiry_raises_expired_even_if_nobody_took_it(make_items):
    [item] = make_items(1)
    m = LeaseManager("w1")
    m.acquire_lease(lease_duration_seconds=30)
    expire_now(item.pk)
    before = snapshot(item.pk)
    with pytest.raises(LeaseExpiredError) as exc:
        m.renew_lease(item.pk)
    assert not isinstance(exc.value, LeaseConflictError)
    assert snapshot(item.pk) == before


def test_renew_really_expires_by_time(make_items):
    [item] = make_items(1)
    m = LeaseManager("w1")
    m.acquire_lease(lease_duration_seconds=0.2)
    time.sleep(0.4)
    with pytest.raises(LeaseExpiredError):
        m.renew_lease(item.pk)
    assert snapshot(item.pk)["lease_holder"] == "w1"  # untouched; the sweep recovers it


def test_renew_by_another_worker_raises_conflict(make_items):
    [item] = make_items(1)
    LeaseManager("w1").acquire_lease()
    before = snapshot(item.pk)
    with pytest.raises(LeaseConflictError) as exc:
        LeaseManager("w2").renew_lease(item.pk)
    assert not isinstance(exc.value, LeaseExpiredError)
    with pytest.raises(LeaseConflictError):
        LeaseManager("w2").renew_lease(item.pk, token=1)
    assert snapshot(item.pk) == before


def test_renew_unknown_id_raises_not_found(db):
    with pytest.raises(WorkItemNotFound):
        LeaseManager("w1").renew_lease("01NOSUCHITEM0000000000000")
    with pytest.raises(WorkItemNotFound):
        LeaseManager("w1").release_lease("01NOSUCHITEM0000000000000", success=True)


def test_batch_renewal_reports_lost_leases(make_items):
    items = make_items(3)
    m = LeaseManager("w1")
    m.acquire_leases(3, lease_duration_seconds=30)
    expire_now(items[1].pk)
    renewed, lost = m.renew_leases(lease_duration_seconds=60)
    assert renewed == {items[0].pk, items[2].pk}
    assert lost == {items[1].pk}
    assert {lease.work_item_id for lease in m.held_leases()} == renewed


# --- releasing ---------------------------------------------------------------------------


def test_successful_release_completes_and_clears_the_lease(make_items):
    [item] = make_items(1)
    m = LeaseManager("w1")
    m.acquire_lease()
    outcome = m.release_lease(item.pk, success=True, output_data={"answer": 42})
    assert (outcome.work_item_id, outcome.status, outcome.token) == (item.pk, "completed", 1)
    row = snapshot(item.pk)
    assert row["status"] == "completed"
    assert row["output_data"] == {"answer": 42}
    assert row["lease_holder"] is None and row["lease_expires_at"] is None
    assert row["completed_at"] >= row["started_at"]
    assert row["updated_at"] == row["completed_at"]
    assert m.held_leases() == []


def test_failed_release_without_retry_fails_for_good(make_items):
    [item] = make_items(1, max_retries=3)
    m = LeaseManager("w1")
    m.acquire_lease()
    m.release_lease(item.pk, success=False, error=ValueError("bad input"))
    row = snapshot(item.pk)
    assert row["status"] == "failed"
    assert row["error_message"] == "ValueError: bad input"
    assert row["retry_count"] == 0
    assert row["completed_at"] is not None


def test_retry_goes_back_to_pending_with_backoff_then_fails_when_exhausted(
    make_items, leasing_settings
):
    leasing_settings(RETRY_BACKOFF_BASE=30)
    [item] = make_items(1, max_retries=2)
    m = LeaseManager("w1")
    for attempt in (1, 2):
        lease = m.acquire_lease()
        assert lease is not None
        now = database_now()
        outcome = m.release_lease(item.pk, success=False, error="boom", retry=True)
        assert outcome.will_retry
        row = snapshot(item.pk)
        assert row["status"] == "pending"
        assert row["retry_count"] == attempt
        assert row["lease_holder"] is None
        # base * 2**retries_so_far, +/- 25% jitter, from the database clock.
        expected = 30 * 2 ** (attempt - 1)
        delay = (row["run_after"] - now).total_seconds()
        assert expected * 0.74 <= delay <= expected * 1.26, delay
        assert m.acquire_lease() is None  # backoff not over yet
        WorkItem.objects.filter(pk=item.pk).update(run_after=None)
    m.acquire_lease()
    outcome = m.release_lease(item.pk, success=False, error="boom", retry=True)
    assert not outcome.will_retry
    row = snapshot(item.pk)
    assert row["status"] == "failed"
    assert row["retry_count"] == 2
    assert row["error_message"] == "boom"


def test_release_by_non_holder_raises_lost_and_changes_nothing(make_items):
    [item] = make_items(1)
    LeaseManager("w1").acquire_lease()
    before = snapshot(item.pk)
    with pytest.raises(LeaseConflictError):
        LeaseManager("w2").release_lease(item.pk, success=True)
    with pytest.raises(LeaseLostError):
        LeaseManager("w2").release_lease(item.pk, success=True, token=1)
    assert snapshot(item.pk) == before


def test_release_of_an_expired_but_unrecovered_lease_still_completes(make_items):
    # Nobody else can hold the item until the sweep recovers it, so finishing
    # the work beats throwing it away; the sweep's UPDATE re-checks the status.
    [item] = make_items(1)
    m = LeaseManager("w1")
    m.acquire_lease()
    expire_now(item.pk)
    m.release_lease(item.pk, success=True)
    assert snapshot(item.pk)["status"] == "completed"


def test_zombie_cannot_renew_or_release_after_its_item_was_reclaimed(make_items):
    [item] = make_items(1)
    a, b = LeaseManager("worker-a"), LeaseManager("worker-b")
    lease_a = a.acquire_lease(lease_duration_seconds=30)
    expire_now(item.pk)
    # What the recovery sweep does to an expired lease: back to pending.
    assert (
        WorkItem.objects.expired()
        .filter(pk=item.pk)
        .update(status="pending", lease_holder=None, lease_expires_at=None, retry_count=1)
        == 1
    )
    lease_b = b.acquire_lease(lease_duration_seconds=30)
    assert lease_b.work_item_id == item.pk and lease_b.token == lease_a.token + 1
    before = snapshot(item.pk)

    with pytest.raises(LeaseConflictError):
        a.renew_lease(item.pk)
    with pytest.raises(LeaseLostError):
        a.release_lease(item.pk, success=True, output_data={"by": "zombie"}, token=lease_a.token)
    with pytest.raises(LeaseLostError):
        a.release_lease(item.pk, success=False, error="zombie", retry=True, token=lease_a.token)
    assert snapshot(item.pk) == before

    b.renew_lease(item.pk)
    b.release_lease(item.pk, success=True, output_data={"by": "worker-b"})
    row = snapshot(item.pk)
    assert row["status"] == "completed"
    assert row["output_data"] == {"by": "worker-b"}


def test_release_after_recovery_to_pending_raises_lost(make_items):
    [item] = make_items(1)
    a = LeaseManager("w1")
    a.acquire_lease()
    WorkItem.objects.filter(pk=item.pk).update(
        status="pending", lease_holder=None, lease_expires_at=None
    )
    with pytest.raises(LeaseLostError) as exc:
        a.release_lease(item.pk, success=True)
    assert "now pending" in str(exc.value)
    assert snapshot(item.pk)["status"] == "pending"


# --- bad input ----------------------------------------------------------------


@pytest.mark.parametrize("duration", [0, -1, float("nan"), float("inf"), "300", True])
def test_bad_lease_durations_are_rejected_without_claiming(make_items, duration):
    make_items(1)
    m = LeaseManager("w1")
    with pytest.raises(InvalidDuration):
        m.acquire_lease(lease_duration_seconds=duration)
    assert WorkItem.objects.pending().count() == 1


@pytest.mark.parametrize("duration", [0, -5, "x"])
def test_bad_renewal_duration_changes_nothing(make_items, duration):
    [item] = make_items(1)
    m = LeaseManager("w1")
    m.acquire_lease()
    before = snapshot(item.pk)
    with pytest.raises(InvalidDuration):
        m.renew_lease(item.pk, lease_duration_seconds=duration)
    assert snapshot(item.pk) == before


def test_bad_release_output_changes_nothing(make_items, leasing_settings):
    leasing_settings(MAX_PAYLOAD_BYTES=100)
    [item] = make_items(1)
    m = LeaseManager("w1")
    m.acquire_lease()
    before = snapshot(item.pk)
    with pytest.raises(PayloadNotSerializable):
        m.release_lease(item.pk, success=True, output_data={"x": object()})
    with pytest.raises(PayloadTooLarge):
        m.release_lease(item.pk, success=True, output_data={"x": "y" * 200})
    with pytest.raises(InvalidInput):
        m.release_lease(item.pk, success="yes")
    assert snapshot(item.pk) == before
    assert m.lease_for(item.pk) is not None


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", 10_001])
def test_bad_batch_sizes_are_rejected(make_items, n):
    make_items(1)
    with pytest.raises(InvalidInput):
        LeaseManager("w1").acquire_leases(n)
    assert WorkItem.objects.pending().count() == 1


@pytest.mark.parametrize("worker_id", ["", "   ", None, 5])
def test_worker_id_must_be_text(worker_id):
    with pytest.raises(InvalidInput):
        LeaseManager(worker_id)


def test_batch_renewal_with_extend_below_only_extends_short_leases(make_items):
    items = make_items(2)
    m = LeaseManager("w1")
    m.acquire_leases(2, lease_duration_seconds=100)
    WorkItem.objects.filter(pk=items[1].pk).update(
        lease_expires_at=database_now() + timedelta(seconds=10)
    )
    # A second back, so "the heartbeat moved" holds on SQLite's millisecond clock too.
    WorkItem.objects.filter(pk=items[0].pk).update(
        heartbeat_at=database_now() - timedelta(seconds=1)
    )
    long_before = snapshot(items[0].pk)
    renewed, lost = m.renew_leases(lease_duration_seconds=100, extend_below=50)
    assert renewed == {items[0].pk, items[1].pk} and lost == set()
    long_after, short_after = snapshot(items[0].pk), snapshot(items[1].pk)
    # Plenty left: the expiry stays (a HOT-eligible update), the heartbeat moves.
    assert long_after["lease_expires_at"] == long_before["lease_expires_at"]
    assert long_after["heartbeat_at"] > long_before["heartbeat_at"]
    # Under the threshold: extended to now + duration as usual.
    assert short_after["lease_expires_at"] - short_after["heartbeat_at"] == timedelta(seconds=100)


def test_zombie_batched_completions_are_refused(make_items):
    items = make_items(3)
    a, b = LeaseManager("worker-a"), LeaseManager("worker-b")
    a_leases = a.acquire_leases(3, lease_duration_seconds=30)
    # items[0] is recovered by the sweep and re-claimed by B; A is a zombie for it.
    expire_now(items[0].pk)
    WorkItem.objects.expired().filter(pk=items[0].pk).update(
        status="pending", lease_holder=None, lease_expires_at=None, retry_count=1
    )
    [b_lease] = b.acquire_leases(1, lease_duration_seconds=30)
    assert b_lease.work_item_id == items[0].pk
    before = snapshot(items[0].pk)

    done = complete(a, [(a_leases[0], '{"by": "zombie"}'), (a_leases[1], "1")])
    assert done.completed == (a_leases[1],) and done.lost == (a_leases[0],)
    assert snapshot(items[0].pk) == before

    done, claimed = complete_and_claim(a, [(a_leases[2], "2")], 5, claim_terms(30), ClaimFilters())
    assert (done.completed, done.lost) == ((a_leases[2],), ())
    assert claimed == []  # nothing pending: B's item is not taken from it
    assert snapshot(items[0].pk) == before
    b.release_lease(items[0].pk, success=True, output_data={"by": "worker-b"})
    assert snapshot(items[0].pk)["output_data"] == {"by": "worker-b"}


def test_complete_and_claim_completes_and_claims_in_one_round_trip(make_items):
    items = make_items(4)
    m = LeaseManager("w1")
    [first] = m.acquire_leases(1)
    done, leases = complete_and_claim(
        m, [(first, '{"ok": true}')], 2, claim_terms(None), ClaimFilters()
    )
    assert done.completed == (first,) and done.lost == ()
    assert [lease.id for lease in leases] == [items[1].pk, items[2].pk]
    assert snapshot(first.id)["status"] == "completed"
    assert snapshot(first.id)["output_data"] == {"ok": True}
    assert {lease.id for lease in m.held_leases()} == {items[1].pk, items[2].pk}


def test_one_claim_gives_each_work_type_its_own_lease_and_deadline():
    from leasing.sql.terms import LeaseTerms

    enqueue_many(
        [
            {"task_id": f"{work_type}-task", "work_type": work_type}
            for work_type in ("long", "short", "capped", "plain")
        ]
    )
    terms = LeaseTerms(
        duration=60, cap=3600, durations={"long": 120, "short": 30}, caps={"capped": 45}
    )
    leases = LeaseManager("w").claim(10, terms, ClaimFilters())
    assert len(leases) == 4
    seconds = {
        row["work_type"]: (
            (row["lease_expires_at"] - row["lease_acquired_at"]).total_seconds(),
            (row["lease_deadline_at"] - row["lease_acquired_at"]).total_seconds(),
        )
        for row in WorkItem.objects.values(
            "work_type", "lease_acquired_at", "lease_expires_at", "lease_deadline_at"
        )
    }
    assert seconds == {
        "long": (120, 3600),
        "short": (30, 3600),
        "capped": (45, 45),  # the lease itself never outlives the deadline
        "plain": (60, 3600),
    }
