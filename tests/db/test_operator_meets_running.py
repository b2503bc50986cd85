"""Operator actions that meet a running item: a force-release of an item asked to stop,
"select all" of leases re-claimed since the page was shown, a cancel of a lease renewed
since then.

Through the public API and the admin, driven the way a browser submits the pages (the
action form, then the confirmation page's form as parsed from its HTML). Runs on
SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import django
import pytest
from django.contrib.admin.models import LogEntry

from leasing import LeaseManager, apply_action, cancel, enqueue
from leasing.exceptions import LeaseLostError
from leasing.models import Checkpoint
from tests.support.admin import (
    change_url,
    changelist_url,
    claim,
    confirm,
    form_fields,
    messages_of,
    shift,
    start_action,
)
from tests.support.helpers import row

pytestmark = pytest.mark.django_db

ASKED = "ended cancelled: it was asked to stop"
IN_PROGRESS_LIST = "status__exact=in_progress"


def _asked_to_stop(task_id: str, **enqueue_fields: Any) -> Any:
    """A running item (claimed by w-1) that an operator asked to stop."""
    lease = claim(task_id, "w-1", **enqueue_fields)
    result = cancel(lease.work_item_id, actor="alice", reason="customer closed the account")
    assert result.applied and result.new_status == "in_progress", result
    return lease


def _transitions(actor: str) -> list[str]:
    """The actions `actor` is recorded to have applied."""
    return [
        c.snapshot_data["action"]
        for c in Checkpoint.objects.filter(checkpoint_type="state_transition")
        if c.snapshot_data["actor"] == actor
    ]


def _reclaimed(item_id: str, task_id: str) -> Any:
    """Another operator force-releases the item and worker w-9 claims it: a new lease."""
    released = apply_action(
        "force_release", item_id, expected_token=None, actor="bob", reason="looks stuck"
    )
    assert released.applied and released.new_status == "pending", released
    lease = LeaseManager("w-9").acquire_lease(lease_duration_seconds=300, task_id_filter=task_id)
    assert lease is not None and lease.work_item_id == item_id
    return lease


# --- 1. a force-release of an item asked to stop ends it cancelled ---------------------


def test_force_release_of_an_item_asked_to_stop_ends_it_cancelled_and_it_never_runs_again():
    lease = _asked_to_stop("task-stop", unique_key="order-7")
    item_id = lease.work_item_id
    fails = enqueue("task-fails", "noop", depends_on=[item_id], on_dependency_failure="fail")
    waits = enqueue("task-waits", "noop", depends_on=[item_id], on_dependency_failure="wait")

    result = apply_action(
        "force_release", item_id, expected_token=lease.token, actor="bob", reason="looks stuck"
    )

    assert result.applied and result.new_status == "cancelled", result
    assert (
        result.detail
        == f"Force-released by bob: looks stuck ({ASKED}) (1 dependent item(s) failed with it)"
    )
    after = row(item_id)
    assert after["status"] == "cancelled"
    assert (after["lease_holder"], after["lease_expires_at"]) == (None, None)
    assert after["completed_at"] is not None and after["retry_count"] == 0
    assert after["cancel_requested_at"] is not None  # the request stays, as a hand-back leaves it
    assert after["error_message"] == (
        "Cancelled as asked; the run ended with: Force-released by bob: looks stuck"
    )
    # Not claimable: no new run starts.
    assert LeaseManager("w-2").acquire_lease(task_id_filter="task-stop") is None
    # The old holder is fenced out.
    with pytest.raises(LeaseLostError):
        LeaseManager("w-1").release_lease(item_id, success=True, token=lease.token)
    # Its unique key is free: a new item takes it.
    assert enqueue("task-again", "noop", unique_key="order-7").pk != item_id
    # Dependents follow their policy, as for a cancel.
    assert row(fails.pk)["status"] == "failed"
    assert row(waits.pk)["status"] == "pending"
    [record] = Checkpoint.objects.filter(
        work_item_id=item_id, checkpoint_type="state_transition", snapshot_data__actor="bob"
    )
    assert (record.snapshot_data["old_status"], record.snapshot_data["new_status"]) == (
        "in_progress",
        "cancelled",
    )


def test_asked_to_stop_outweighs_a_unique_key_held_by_another_item():
    """Superseded or cancelled: it was asked to stop, so cancelled (as a hand-back does)."""
    lease = _asked_to_stop("task-stop", unique_key="order-8", unique_while="pending")
    holder = enqueue("task-holder", "noop", unique_key="order-8", unique_while="pending")
    assert holder.pk != lease.work_item_id

    result = apply_action(
        "force_release", lease.work_item_id, expected_token=lease.token, actor="bob", reason="x"
    )
    assert result.applied and result.new_status == "cancelled", result
    assert ASKED in result.detail and "superseded" not in result.detail
    assert row(lease.work_item_id)["error_message"].startswith("Cancelled as asked")


def test_force_release_of_an_item_not_asked_to_stop_still_returns_it_to_pending():
    lease = claim("task-run", "w-1")
    result = apply_action(
        "force_release", lease.work_item_id, expected_token=lease.token, actor="bob", reason="x"
    )
    assert result.applied and result.new_status == "pending", result
    assert ASKED not in result.detail
    assert row(lease.work_item_id)["cancel_requested_at"] is None


def test_the_admin_force_release_of_an_item_asked_to_stop_says_it_ended_cancelled(
    operator_client,
):
    lease = _asked_to_stop("task-stop")
    item_id = lease.work_item_id
    page = start_action(operator_client, "force_release_selected", item_id)
    done = confirm(operator_client, page, reason="worker looks stuck")
    text = messages_of(done)
    assert f"{item_id}: Force-released by operator: worker looks stuck ({ASKED})." in text, text
    assert "1 work item force-released." in text
    assert row(item_id)["status"] == "cancelled"
    assert LeaseManager("w-2").acquire_lease(task_id_filter="task-stop") is None


# --- 2. "select all" fenced by the lease tokens the page counted -------------------------


def _select_all_page(client: Any, action: str, first_id: str) -> dict[str, list[str]]:
    page = client.post(
        changelist_url(IN_PROGRESS_LIST),
        {"action": action, "_selected_action": [first_id], "select_across": "1", "index": "0"},
    )
    assert "admin/leasing/workitem/bulk_confirmation.html" in [t.name for t in page.templates]
    fields = form_fields(page.content.decode(), "leasing-bulk-form")
    fields.pop("csrfmiddlewaretoken", None)
    fields["reason"] = ["worker-1 looks stuck"]
    return fields


@pytest.mark.parametrize("action", ["force_release_selected", "force_fail_selected"])
def test_select_all_of_a_lease_reclaimed_since_the_page_writes_nothing(operator_client, action):
    """The page showed the item under token 1; another worker re-claimed it (token 2, in
    progress still, so the filter and the status match): confirming is refused as a
    changed selection, and the live lease is left alone."""
    lease = claim("task-a", "w-1")
    item_id = lease.work_item_id
    fields = _select_all_page(operator_client, action, item_id)
    new_lease = _reclaimed(item_id, "task-a")
    assert new_lease.token == lease.token + 1

    response = operator_client.post(changelist_url(IN_PROGRESS_LIST), fields, follow=True)
    [message] = response.context["messages"]
    assert message.level_tag == "error"
    assert message.message == (
        "The selection changed after the page was shown: 1 work item matches now, as many as "
        "then, but not the same one, or not in the same status or lease (work items with "
        f"{IN_PROGRESS_LIST}); nothing was changed. Check the items and confirm again."
    )
    after = row(item_id)
    assert (after["status"], after["lease_holder"], after["lease_token"]) == (
        "in_progress",
        "w-9",
        new_lease.token,
    )
    assert _transitions("operator") == [] and not LogEntry.objects.exists()
    # The new holder is unaffected.
    assert LeaseManager("w-9").release_lease(item_id, success=True, token=new_lease.token)


@pytest.mark.parametrize("action", ["force_release_selected", "force_fail_selected"])
def test_select_all_skips_a_lease_claimed_between_the_confirmation_and_the_change(
    operator_client, monkeypatch, action
):
    """The confirmation matched (same items, statuses, tokens); then, before the change,
    another worker claims the item anew: it is skipped, by the token the page counted."""
    from leasing.admin import bulk

    lease = claim("task-a", "w-1")
    item_id = lease.work_item_id
    fields = _select_all_page(operator_client, action, item_id)
    confirmed = bulk.confirmed
    new_leases = []

    def confirmed_then_reclaimed(*args: Any, **kwargs: Any) -> Any:
        outcome = confirmed(*args, **kwargs)
        assert outcome[0] is not None, "the confirmation should have matched"
        new_leases.append(_reclaimed(item_id, "task-a"))
        return outcome

    monkeypatch.setattr(bulk, "confirmed", confirmed_then_reclaimed)
    done = operator_client.post(changelist_url(IN_PROGRESS_LIST), fields, follow=True)

    [new_lease] = new_leases
    text = messages_of(done)
    assert (
        f"1 skipped: its lease changed since the page was shown (token {lease.token} -> "
        f"{new_lease.token})." in text
    ), text
    after = row(item_id)
    assert (after["status"], after["lease_holder"], after["lease_token"]) == (
        "in_progress",
        "w-9",
        new_lease.token,
    )
    assert _transitions("operator") == [] and not LogEntry.objects.exists()


def test_select_all_force_release_takes_a_lease_only_renewed_since_the_page(operator_client):
    """A renewal (the same claim, a later heartbeat) is no change of lease on the bulk
    path: the page counts items, it does not show each lease."""
    lease = claim("task-a", "w-1")
    item_id = lease.work_item_id
    shift(item_id, heartbeat_at=-10)
    fields = _select_all_page(operator_client, "force_release_selected", item_id)
    assert LeaseManager("w-1").renew_lease(item_id, 600, token=lease.token)

    done = operator_client.post(changelist_url(IN_PROGRESS_LIST), fields, follow=True)
    assert f"1 work item force-released (work items with {IN_PROGRESS_LIST})." in messages_of(done)
    assert row(item_id)["status"] == "pending"


# --- 3. a cancel is fenced by the token, not the heartbeat -------------------------------


def _item_page_action(client: Any, action: str, item_id: str) -> Any:
    """Choose `action` from the item page's own menu (Django 6.1's change-form actions)."""
    page = client.post(
        change_url(item_id), {"CHANGE_FORM-action": action, "_selected_action": [item_id]}
    )
    assert "admin/leasing/workitem/operator_action_confirmation.html" in [
        t.name for t in page.templates
    ]
    return page


PAGES = [
    pytest.param("list", id="list"),
    pytest.param(
        "item",
        id="item-page",
        marks=pytest.mark.skipif(
            django.VERSION < (6, 1), reason="Django 6.0 posts the item page's menu to the list"
        ),
    ),
]


def _action_page(client: Any, where: str, action: str, item_id: str) -> Any:
    if where == "item":
        return _item_page_action(client, action, item_id)
    return start_action(client, action, item_id)


@pytest.mark.parametrize("where", PAGES)
def test_cancel_of_a_running_item_whose_lease_renewed_since_the_page_asks_it_to_stop(
    operator_client, where
):
    lease = claim("task-run", "w-1")
    item_id = lease.work_item_id
    shift(item_id, heartbeat_at=-10)
    page = _action_page(operator_client, where, "cancel_selected", item_id)
    # The worker renews, as it does every heartbeat interval: the same run, still running.
    assert LeaseManager("w-1").renew_lease(item_id, 600, token=lease.token)

    done = confirm(operator_client, page, reason="customer closed the account")
    text = messages_of(done)
    assert "1 work item cancelled or asked to stop." in text, text
    assert not any("renewed" in m for m in text), text
    after = row(item_id)
    assert after["status"] == "in_progress" and after["lease_token"] == lease.token
    assert after["cancel_requested_at"] is not None
    assert _transitions("operator") == ["cancel"]


@pytest.mark.parametrize("where", PAGES)
def test_cancel_of_a_running_item_reclaimed_since_the_page_is_skipped(operator_client, where):
    """A new claim is another run than the one the operator chose to stop."""
    lease = claim("task-run", "w-1")
    item_id = lease.work_item_id
    page = _action_page(operator_client, where, "cancel_selected", item_id)
    new_lease = _reclaimed(item_id, "task-run")

    done = confirm(operator_client, page, reason="customer closed the account")
    assert any(
        f"{item_id} skipped: its lease changed since the page was shown" in m
        for m in messages_of(done)
    ), messages_of(done)
    after = row(item_id)
    assert after["lease_token"] == new_lease.token and after["cancel_requested_at"] is None
    assert _transitions("operator") == []


@pytest.mark.parametrize("where", PAGES)
@pytest.mark.parametrize("action", ["force_release_selected", "force_fail_selected"])
def test_taking_a_lease_renewed_since_the_page_is_still_skipped(operator_client, where, action):
    """Force-release and force-fail take the lease away: a worker that renewed since the
    page was shown proved it is alive, so its item is skipped."""
    lease = claim("task-run", "w-1")
    item_id = lease.work_item_id
    shift(item_id, heartbeat_at=-10)
    page = _action_page(operator_client, where, action, item_id)
    assert LeaseManager("w-1").renew_lease(item_id, 600, token=lease.token)

    done = confirm(operator_client, page, reason="looked stuck")
    assert any(
        f"{item_id} skipped: its lease was renewed since the page was shown" in m
        for m in messages_of(done)
    ), messages_of(done)
    assert row(item_id)["status"] == "in_progress"
    assert _transitions("operator") == []
