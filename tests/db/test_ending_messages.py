"""What an ending says: the item's error message and its `error_boundary` checkpoint agree
with what became of the item, on the worker's path and the sweep's.

A "- retry n/m" note is written only when the item really goes back to
pending: an item superseded (another pending item holds its unique key) or
cancelled (it was asked to stop) is never retried, so its message promises
nothing. The checkpoint's `error` is the message stored on the row, whichever
path ended the attempt.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from leasing import LeaseManager, cancel, enqueue
from leasing.exceptions import DatabaseUnavailable
from leasing.models import WorkItem
from leasing.services import endings
from leasing.services.terms import claim_filters, claim_terms
from leasing.testing import override_handler, run_item
from tests.support.helpers import database_now, row
from tests.support.recovery import boundaries, expire, sweep

pytestmark = pytest.mark.django_db

LATER = timedelta(hours=1)


def _held_key(task_id: str, key: str, **fields):
    """An item of `key` claimed (it gave its key up), then a new pending holder of the key."""
    item = enqueue(task_id, "noop", unique_key=key, unique_while="pending", **fields)
    manager = LeaseManager(f"w-{task_id}")
    lease = manager.acquire_lease(task_id_filter=task_id)
    assert lease is not None and lease.work_item_id == item.pk
    holder = enqueue(
        f"{task_id}-holder",
        "noop",
        unique_key=key,
        unique_while="pending",
        run_after=database_now() + LATER,
    )
    assert not holder.duplicate
    return item, holder, manager, lease


def _says(item_id: str, *, status: str, reason: str, message: str) -> None:
    """The row and its one `error_boundary` checkpoint both say this."""
    r = row(item_id)
    assert (r["status"], r["error_message"]) == (status, message)
    [boundary] = boundaries(item_id)
    snapshot = boundary.snapshot_data
    assert (snapshot["reason"], snapshot["new_status"], snapshot["will_retry"]) == (
        reason,
        status,
        status == "pending",
    )
    assert snapshot["error"] == message


def _timed_out(*item_ids: str) -> None:
    """Leases that ran into their deadline (90 s after their claim), now past."""
    WorkItem.objects.filter(pk__in=item_ids).update(
        lease_acquired_at=database_now() - timedelta(seconds=91),
        lease_deadline_at=database_now() - timedelta(seconds=1),
        lease_expires_at=database_now() - timedelta(seconds=1),
    )


# --- the worker's path ------------------------------------------------------------------


def test_a_run_past_its_timeout_superseded_by_the_holder_of_its_key_promises_no_retry():
    item = enqueue("t", "test.slow", unique_key="k", unique_while="pending", max_retries=3)
    holders = []

    def slow(ctx):
        # While it runs (it gave its key up when claimed), a new item takes the key.
        later = database_now() + LATER
        holders.append(
            enqueue("t2", "test.slow", unique_key="k", unique_while="pending", run_after=later)
        )
        time.sleep(1.2)  # past its timeout
        return {"late": True}

    with override_handler("test.slow", slow, timeout=1, max_retries=3):
        run = run_item(item)

    assert run.timed_out
    [holder] = holders
    assert not holder.duplicate
    _says(
        item.pk,
        status="failed",
        reason="superseded",
        message=f"Superseded by {holder.pk}, which holds its unique key; Timed out after 1 s",
    )
    assert row(holder.pk)["status"] == "pending"


def test_a_timed_out_attempt_gets_its_retry_note_only_when_it_goes_back_to_pending():
    superseded, holder, manager, lease = _held_key("a", "k", max_retries=3)
    returning = enqueue("b", "noop", unique_key="other", unique_while="pending", max_retries=3)
    other = LeaseManager("w-b").acquire_lease(task_id_filter="b")
    assert other is not None

    ended = endings.time_out_attempt(manager, lease, retry=True)
    retried = endings.time_out_attempt(LeaseManager("w-b"), other, retry=True)

    assert (ended.status, ended.superseded_by, ended.will_retry) == ("failed", holder.pk, False)
    timed_out = f"Timed out after {round(lease.cap_seconds)} s"
    _says(
        superseded.pk,
        status="failed",
        reason="superseded",
        message=f"Superseded by {holder.pk}, which holds its unique key; {timed_out}",
    )
    assert (retried.status, retried.retry_count) == ("pending", 1)
    _says(
        returning.pk,
        status="pending",
        reason="timed_out",
        message=f"Timed out after {round(other.cap_seconds)} s - retry 1/3",
    )


def test_a_failed_attempt_superseded_records_the_message_the_row_took():
    item, holder, manager, lease = _held_key("a", "k", max_retries=3)

    outcome = endings.fail_attempt(manager, lease, RuntimeError("boom"), retry=True)

    assert (outcome.status, outcome.superseded_by) == ("failed", holder.pk)
    _says(
        item.pk,
        status="failed",
        reason="superseded",
        message=f"Superseded by {holder.pk}, which holds its unique key; RuntimeError: boom",
    )
    assert "retry" not in row(item.pk)["error_message"]


def test_an_interrupted_attempt_superseded_records_the_message_the_row_took():
    item, holder, manager, lease = _held_key("a", "k")

    endings.interrupt_attempt(manager, lease, DatabaseUnavailable("connection lost"))

    _says(
        item.pk,
        status="failed",
        reason="superseded",
        message=(
            f"Superseded by {holder.pk}, which holds its unique key; "
            "DatabaseUnavailable: connection lost"
        ),
    )


@pytest.mark.parametrize("ending", ["failure", "time-out", "interruption"])
def test_the_worker_records_a_cancelled_ending_as_the_row_says_it(ending):
    """The sweep's checkpoint of a cancelled item holds the row's whole message
    ("Cancelled as asked; the run ended with: ..."): the worker's does too."""
    item = enqueue("a", "noop", max_retries=3)
    manager = LeaseManager("w")
    lease = manager.acquire_lease()
    assert lease is not None
    assert cancel(item.pk, actor="ops", reason="not wanted").applied

    if ending == "failure":
        endings.fail_attempt(manager, lease, RuntimeError("stopped"), retry=True)
        ended_with = "RuntimeError: stopped"
    elif ending == "time-out":
        endings.time_out_attempt(manager, lease, retry=True)
        ended_with = f"Timed out after {round(lease.cap_seconds)} s"
    else:
        endings.interrupt_attempt(manager, lease, DatabaseUnavailable("connection lost"))
        ended_with = "DatabaseUnavailable: connection lost"

    _says(
        item.pk,
        status="cancelled",
        reason="cancelled",
        message=f"Cancelled as asked; the run ended with: {ended_with}",
    )


# --- the sweep's path -------------------------------------------------------------------


def test_the_sweep_gives_a_superseded_timed_out_item_no_retry_note():
    item = enqueue("a", "noop", unique_key="k", unique_while="pending", max_retries=3)
    LeaseManager("wedged").claim(1, claim_terms(60, cap_seconds=90), claim_filters("noop", "a"))
    holder = enqueue(
        "h", "noop", unique_key="k", unique_while="pending", run_after=database_now() + LATER
    )
    returning = enqueue("b", "noop", max_retries=3)
    LeaseManager("wedged").claim(1, claim_terms(60, cap_seconds=90), claim_filters("noop", "b"))
    _timed_out(item.pk, returning.pk)

    stats = sweep().scan_and_recover()

    assert (stats.errors, stats.recovered, stats.failed) == (0, 1, 1)
    _says(
        item.pk,
        status="failed",
        reason="superseded",
        message=f"Superseded by {holder.pk}, which holds its unique key; Timed out after 90 s",
    )
    _says(
        returning.pk,
        status="pending",
        reason="timed_out",
        message="Timed out after 90 s - retry 1/3",
    )


def test_the_sweep_gives_a_superseded_expired_item_no_retry_note():
    item, holder, _manager, _lease = _held_key("a", "k", max_retries=3)
    returning = enqueue("b", "noop", max_retries=3)
    assert LeaseManager("w-b").acquire_lease(task_id_filter="b") is not None
    expire(item.pk, returning.pk)

    stats = sweep().scan_and_recover()

    assert (stats.errors, stats.recovered, stats.failed) == (0, 1, 1)
    _says(
        item.pk,
        status="failed",
        reason="superseded",
        message=f"Superseded by {holder.pk}, which holds its unique key; Lease expired",
    )
    _says(
        returning.pk, status="pending", reason="lease_expired", message="Lease expired - retry 1/3"
    )


def test_of_two_expired_items_of_one_key_the_superseded_one_promises_no_retry():
    first = enqueue("a", "noop", unique_key="k", unique_while="pending", priority=2)
    LeaseManager("w1").acquire_lease()
    second = enqueue("b", "noop", unique_key="k", unique_while="pending", priority=1)
    LeaseManager("w2").acquire_lease()
    expire(first.pk, second.pk)

    sweep().scan_and_recover()

    low, high = sorted([first.pk, second.pk])
    _says(low, status="pending", reason="lease_expired", message="Lease expired - retry 1/3")
    _says(
        high,
        status="failed",
        reason="superseded",
        message=f"Superseded by {low}, which holds its unique key; Lease expired",
    )
