"""Unique keys against a return to pending: the returning item is superseded, never an error.

An item with `unique_while="pending"` gives its key up when a worker claims
it, so a new item may take the key while the first one runs. Every
transition that would put the first one back to pending (a failed attempt's
retry, the sweep's recovery of an expired lease, a hand-back, an
interruption, a force-release) finds the holder and ends the item failed,
"Superseded by <holder>", instead of breaking the key's unique index; an
operator's retry of a failed item whose key is held is skipped.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from leasing import LeaseManager, apply_action, enqueue, enqueue_many
from leasing.models import Checkpoint, WorkItem
from leasing.states import WorkItemStatus
from tests.support.helpers import database_now, row
from tests.support.recovery import boundaries, expire, sweep

pytestmark = pytest.mark.django_db


def _running_then_held(work_type: str = "noop", **fields):
    """A claims key k and runs; B then takes k while pending, due in an hour."""
    a = enqueue("a", work_type, unique_key="k", unique_while="pending", **fields)
    manager = LeaseManager("w1")
    lease = manager.acquire_lease(task_id_filter="a")
    assert lease is not None and lease.work_item_id == a.pk
    b = enqueue(
        "b",
        work_type,
        unique_key="k",
        unique_while="pending",
        run_after=database_now() + timedelta(hours=1),
    )
    assert not b.duplicate
    return a, b, manager, lease


def _superseded(item_id: str, holder: str) -> None:
    r = row(item_id)
    assert r["status"] == WorkItemStatus.FAILED
    assert r["error_message"].startswith(f"Superseded by {holder}, which holds its unique key")
    assert r["lease_holder"] is None and r["completed_at"] is not None


def _holds(item_id: str) -> None:
    assert row(item_id)["status"] == WorkItemStatus.PENDING
    holders = WorkItem.objects.filter(unique_key="k", status=WorkItemStatus.PENDING)
    assert list(holders.values_list("pk", flat=True)) == [item_id]


def test_the_sweep_supersedes_an_expired_item_whose_key_is_held_and_recovers_the_rest():
    others = enqueue_many([{"task_id": f"o{i}", "work_type": "noop"} for i in range(4)])
    a, b, _manager, _lease = _running_then_held()
    LeaseManager("w2").acquire_leases(4)
    expire(a.pk, *[o.pk for o in others])

    stats = sweep().scan_and_recover()

    assert (stats.errors, stats.expired_found, stats.recovered, stats.failed) == (0, 5, 4, 1)
    _superseded(a.pk, b.pk)
    _holds(b.pk)
    assert all(row(o.pk)["status"] == "pending" for o in others)
    [boundary] = boundaries(a.pk)
    assert boundary.snapshot_data["reason"] == "superseded"
    assert boundary.snapshot_data["new_status"] == "failed"
    assert boundary.snapshot_data["will_retry"] is False
    # The next pass has nothing left to do: no lease is stranded.
    assert sweep().scan_and_recover().expired_found == 0


def test_of_two_expired_items_of_one_key_the_first_returns_and_supersedes_the_other():
    first = enqueue("a", "noop", unique_key="k", unique_while="pending", priority=2)
    LeaseManager("w1").acquire_lease()
    second = enqueue("b", "noop", unique_key="k", unique_while="pending", priority=1)
    LeaseManager("w2").acquire_lease()
    expire(first.pk, second.pk)

    stats = sweep().scan_and_recover()

    assert (stats.errors, stats.recovered, stats.failed) == (0, 1, 1)
    low, high = sorted([first.pk, second.pk])
    _holds(low)
    _superseded(high, low)


def test_the_sweep_returns_expired_items_of_one_period_key_all_to_pending():
    """A period key's holders overlap by design: the sweep supersedes none of them."""
    first = enqueue("a", "noop", unique_key="k", unique_while=timedelta(seconds=30))
    # Its period ended a second ago (an end "now" could tie with the next enqueue's clock).
    WorkItem.objects.filter(pk=first.pk).update(unique_until=database_now() - timedelta(seconds=1))
    second = enqueue("b", "noop", unique_key="k", unique_while=timedelta(seconds=30))
    assert not second.duplicate
    assert len(LeaseManager("w1").acquire_leases(2)) == 2
    expire(first.pk, second.pk)

    stats = sweep().scan_and_recover()

    assert (stats.errors, stats.recovered, stats.failed) == (0, 2, 0)
    assert {row(i)["status"] for i in (first.pk, second.pk)} == {"pending"}
    assert {row(i)["retry_count"] for i in (first.pk, second.pk)} == {1}


def test_a_forced_stop_hands_back_two_running_items_of_one_key_and_the_rest():
    """Two running items may share a pending-scoped key (each gave it up when claimed);
    handed back together, the first returns and supersedes the other, and an item
    without a key beside them is handed back as always (no attempt counted)."""
    first = enqueue("a", "noop", unique_key="k", unique_while="pending")
    manager = LeaseManager("w1")
    leases = [manager.acquire_lease(task_id_filter="a")]
    second = enqueue("b", "noop", unique_key="k", unique_while="pending")
    plain = enqueue("c", "noop")
    leases += manager.acquire_leases(2)
    assert sorted(lease.work_item_id for lease in leases if lease) == sorted(
        [first.pk, second.pk, plain.pk]
    )

    handed_back = manager.requeue_all([lease.key for lease in leases if lease])

    assert handed_back == 3
    low, high = sorted([first.pk, second.pk])
    _holds(low)
    _superseded(high, low)
    assert (row(plain.pk)["status"], row(plain.pk)["retry_count"]) == ("pending", 0)
    assert row(low)["retry_count"] == 0


def test_a_failed_attempt_is_superseded_instead_of_retried():
    a, b, manager, lease = _running_then_held()
    outcome = manager.release_lease(a.pk, False, error="boom", retry=True, token=lease.token)
    assert (outcome.status, outcome.superseded_by, outcome.retry_count) == ("failed", b.pk, 0)
    _superseded(a.pk, b.pk)
    assert row(a.pk)["error_message"].endswith("boom")
    _holds(b.pk)


def test_a_failed_attempt_with_no_retry_left_just_fails():
    a, b, manager, lease = _running_then_held(max_retries=0)
    outcome = manager.release_lease(a.pk, False, error="boom", retry=True, token=lease.token)
    assert (outcome.status, outcome.superseded_by) == ("failed", None)
    assert row(a.pk)["error_message"] == "boom"


def test_a_hand_back_is_superseded():
    a, b, manager, lease = _running_then_held()
    outcome = manager.requeue_lease(a.pk, token=lease.token)
    assert (outcome.status, outcome.superseded_by) == ("failed", b.pk)
    _superseded(a.pk, b.pk)
    _holds(b.pk)


def test_an_item_without_another_holder_goes_back_to_pending_as_before():
    a = enqueue("a", "noop", unique_key="k", unique_while="pending")
    manager = LeaseManager("w1")
    lease = manager.acquire_lease()
    outcome = manager.release_lease(a.pk, False, error="boom", retry=True, token=lease.token)
    assert (outcome.status, outcome.superseded_by, outcome.retry_count) == ("pending", None, 1)
    _holds(a.pk)


def test_an_interrupted_attempt_is_superseded_with_its_checkpoint():
    from leasing.exceptions import DatabaseUnavailable
    from leasing.services import endings

    a, b, manager, lease = _running_then_held()
    outcome = endings.interrupt_attempt(manager, lease, DatabaseUnavailable("connection lost"))
    assert (outcome.status, outcome.superseded_by) == ("failed", b.pk)
    _superseded(a.pk, b.pk)
    [boundary] = boundaries(a.pk)
    assert boundary.snapshot_data["reason"] == "superseded"


def test_force_release_supersedes_and_says_so():
    a, b, _manager, lease = _running_then_held()
    result = apply_action(
        "force_release", a.pk, expected_token=lease.token, actor="ops", reason="stuck"
    )
    assert result.applied and result.new_status == "failed"
    assert f"superseded by {b.pk}" in result.detail
    _superseded(a.pk, b.pk)
    _holds(b.pk)
    audit = Checkpoint.objects.get(work_item_id=a.pk, checkpoint_type="state_transition")
    assert audit.snapshot_data["new_status"] == "failed"


def test_retry_of_a_failed_item_whose_key_is_held_is_skipped_and_writes_nothing():
    a, b, manager, lease = _running_then_held(max_retries=0)
    manager.release_lease(a.pk, False, error="boom", token=lease.token)
    before = row(a.pk)

    result = apply_action("retry", a.pk, expected_token=None, actor="ops", reason="again")

    assert not result.applied
    assert f"its unique key is held by {b.pk}" in result.detail
    assert row(a.pk) == before
    assert not Checkpoint.objects.filter(checkpoint_type="state_transition").exists()


def test_admin_force_release_and_retry_of_such_items_answer_with_a_message(operator_client):
    from tests.support.admin import confirm, messages_of, start_action

    a, b, _manager, _lease = _running_then_held()
    page = start_action(operator_client, "force_release_selected", a.pk)
    released = confirm(operator_client, page, reason="worker is wedged")
    assert released.status_code == 200
    assert any(f"superseded by {b.pk}" in m for m in messages_of(released))
    _superseded(a.pk, b.pk)

    page = start_action(operator_client, "retry_failed_selected", a.pk)
    retried = confirm(operator_client, page, reason="run it again")
    assert retried.status_code == 200
    assert any(f"held by {b.pk}" in m for m in messages_of(retried))
    assert row(a.pk)["status"] == "failed"


def test_dependents_of_a_superseded_item_fail_with_it():
    a, b, manager, lease = _running_then_held()
    dependent = enqueue("c", "noop", depends_on=[a.pk], on_dependency_failure="fail")
    manager.requeue_lease(a.pk, token=lease.token)
    _superseded(a.pk, b.pk)
    assert row(dependent.pk)["status"] == "failed"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_returns_to_pending_racing_enqueues_of_the_same_key_never_fail(threads):
    """Each round: one thread fails a running item (retry), another enqueues its key.

    Whichever commits first, the other sees it: never an IntegrityError, and at
    most one pending holder of the key.
    """
    for round_ in range(25):
        key = f"race-{round_}"
        a = enqueue(f"a{round_}", "noop", unique_key=key, unique_while="pending")
        manager = LeaseManager(f"w{round_}")
        lease = manager.acquire_lease(task_id_filter=f"a{round_}")
        assert lease is not None

        def act(i: int, a=a, lease=lease, manager=manager, key=key, task=f"b{round_}"):
            if i == 0:
                return manager.release_lease(a.pk, False, error="x", retry=True, token=lease.token)
            return enqueue(task, "noop", unique_key=key, unique_while="pending")

        outcome, b = threads(2, act)
        holders = list(WorkItem.objects.filter(unique_key=key, status="pending"))
        assert len(holders) == 1
        if b.duplicate:  # the retry committed first: the enqueue returned it
            assert (outcome.status, b.pk) == ("pending", a.pk)
        else:
            assert (outcome.status, outcome.superseded_by) == ("failed", b.pk)
