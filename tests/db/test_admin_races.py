"""An operator action confirmed on a page that shows an item in one status applies only
if the item is still in that status: one changed meanwhile (another operator retried
it) is skipped and said so, even where the action also accepts its new status.

The race the fence missed: a failed item, its Delete confirmation open; another
operator retries it (pending: same lease token, no heartbeat, and a delete accepts
pending items); confirming deleted the re-queued item. Driven the way a browser
submits the pages (the action form, then the confirmation page's form as parsed
from its HTML). Runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import django
import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from leasing import LeaseManager, enqueue
from leasing.exceptions import InvalidInput
from leasing.models import Checkpoint, WorkItem
from leasing.services.operations import apply_action
from tests.support.admin import (
    change_url,
    changelist_url,
    claim,
    confirm,
    form_fields,
    messages_of,
    start_action,
)
from tests.support.helpers import database_now, row

pytestmark = pytest.mark.django_db

SHOWN_ELSEWHERE = "as when the page was shown"


def _failed(task_id: str) -> str:
    lease = claim(task_id, "w-1", max_retries=0)
    LeaseManager("w-1").release_lease(
        lease.work_item_id, False, error=ValueError("lookup down"), token=lease.token
    )
    return lease.work_item_id


def _completed(task_id: str) -> str:
    lease = claim(task_id, "w-1")
    LeaseManager("w-1").release_lease(lease.work_item_id, True, token=lease.token)
    return lease.work_item_id


def _retried_by_someone_else(item_id: str) -> None:
    result = apply_action(
        "retry", item_id, expected_token=None, actor="bob", reason="the lookup is back"
    )
    assert result.applied and result.new_status == "pending"


def _transitions() -> list[tuple[str, str]]:
    return list(
        Checkpoint.objects.filter(checkpoint_type="state_transition")
        .order_by("checkpoint_id")
        .values_list("snapshot_data__action", "snapshot_data__actor")
    )


def _delete_page(client: Client, where: str, item_id: str):
    if where == "list":
        return start_action(client, "delete_items_selected", item_id)
    # The item page's own action menu (Django 6.1: the change form's actions).
    return client.post(
        change_url(item_id),
        {"CHANGE_FORM-action": "delete_items_selected", "_selected_action": [item_id]},
    )


@pytest.mark.parametrize(
    "where",
    [
        "list",
        pytest.param(
            "item page",
            marks=pytest.mark.skipif(
                django.VERSION < (6, 1), reason="Django 6.0: the item page posts to the list"
            ),
        ),
    ],
)
def test_deleting_a_failed_item_retried_since_the_page_was_shown_skips_it(operator_client, where):
    item_id = _failed("task-junk")
    page = _delete_page(operator_client, where, item_id)
    assert page.status_code == 200
    _retried_by_someone_else(item_id)
    queued = row(item_id)

    done = confirm(operator_client, page, reason="clean up failed junk")
    assert done.status_code == 200
    assert messages_of(done) == [
        f"{item_id} skipped: it is pending now, not failed {SHOWN_ELSEWHERE}."
    ]
    assert row(item_id) == queued  # still queued, untouched
    assert _transitions() == [("retry", "bob")]
    assert not LogEntry.objects.exists()


def _in_progress() -> str:
    return claim("task-running", "w-1").work_item_id


def _pending() -> str:
    return enqueue("task-pending", "noop").pk


def _deferred() -> str:
    return enqueue("task-later", "noop", run_after=database_now().replace(year=2099)).pk


# (action, the item's status now, a status the page may have shown it in instead)
EVERY_ACTION = [
    ("force_release_selected", _in_progress, "pending"),
    ("force_fail_selected", _pending, "in_progress"),
    ("retry_failed_selected", lambda: _failed("task-bad"), "cancelled"),
    ("cancel_selected", _pending, "in_progress"),
    ("delete_items_selected", lambda: _completed("task-done"), "failed"),
    ("run_now_selected", _deferred, "failed"),
]


@pytest.mark.parametrize(
    ("action", "make", "shown"), EVERY_ACTION, ids=[a[0] for a in EVERY_ACTION]
)
def test_every_action_skips_an_item_no_longer_in_the_status_the_page_showed(
    operator_client, action, make, shown
):
    """The page carries the status it showed each item in: a confirmation whose status is
    not the item's any more (here: the page's field standing for a status the item left)
    writes nothing for it, whatever action it is, and says why."""
    item_id = make()
    before = row(item_id)
    page = start_action(operator_client, action, item_id)
    fields = form_fields(page.content.decode(), "leasing-operator-form")
    assert fields[f"status-{item_id}"] == [before["status"]]

    done = confirm(operator_client, page, reason="as seen", **{f"status-{item_id}": shown})
    assert messages_of(done) == [
        f"{item_id} skipped: it is {before['status']} now, not {shown} {SHOWN_ELSEWHERE}."
    ]
    assert row(item_id) == before
    assert _transitions() == []
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    "status",
    [
        pytest.param(None, id="removed"),
        pytest.param("", id="empty"),
        pytest.param("deleted", id="not-a-status"),
        pytest.param("COMPLETED", id="upper-case"),
        pytest.param("completed ", id="padded"),
        pytest.param("é" * 300, id="long-not-ascii"),
    ],
)
def test_a_missing_or_garbled_status_on_the_confirmation_writes_nothing(operator_client, status):
    """A status the page cannot have shown is an altered page: nothing is applied, never
    a 500, and the page is shown again with the item's status of now."""
    item_id = _completed("task-done")
    before = row(item_id)
    page = start_action(operator_client, "delete_items_selected", item_id)
    done = confirm(operator_client, page, reason="cleanup", **{f"status-{item_id}": status})
    assert done.status_code == 200
    [message] = messages_of(done)
    assert "altered or is incomplete" in message and "status" in message
    assert "nothing was changed" in message
    assert row(item_id) == before
    assert _transitions() == []
    assert not LogEntry.objects.exists()

    again = form_fields(done.content.decode(), "leasing-operator-form")
    assert again[f"status-{item_id}"] == ["completed"]
    assert again["reason"] == ["cleanup"]
    again.pop("csrfmiddlewaretoken", None)
    deleted = operator_client.post(changelist_url(), again, follow=True)
    assert "1 work item deleted." in messages_of(deleted)
    assert not WorkItem.objects.filter(pk=item_id).exists()


def test_select_all_delete_of_items_one_of_which_was_retried_meanwhile_writes_nothing(
    operator_client,
):
    """On an unfiltered list, "select all" then Delete: 2 items match, a completed and a
    failed one. Another operator retries the failed one: the same 2 items match, but
    not in the statuses shown, so nothing is deleted (the count and ids alone deleted
    the re-queued item); the page is shown again with the statuses of now."""
    done_id, failed_id = _completed("task-done"), _failed("task-bad")
    url = changelist_url()
    page = operator_client.post(
        url,
        {
            "action": "delete_items_selected",
            "_selected_action": [done_id],
            "select_across": "1",
            "index": "0",
        },
    )
    fields = form_fields(page.content.decode(), "leasing-bulk-form")
    assert fields["expected"] == ["2"]
    fields["reason"] = ["clean up"]
    _retried_by_someone_else(failed_id)
    queued = row(failed_id)

    response = operator_client.post(url, fields, follow=True)
    assert response.status_code == 200
    [message] = response.context["messages"]
    assert message.level_tag == "error"
    assert message.message == (
        "The selection changed after the page was shown: 2 work items match now, as many as "
        "then, but not the same ones, or not in the same status or lease (every work item); "
        "nothing was changed. Check the items and confirm again."
    )
    assert row(failed_id) == queued and row(done_id)["status"] == "completed"
    assert _transitions() == [("retry", "bob")]
    assert not LogEntry.objects.exists()

    again = form_fields(response.content.decode(), "leasing-bulk-form")
    assert again["fingerprint"] != fields["fingerprint"]
    confirmed = operator_client.post(url, again, follow=True)
    assert "2 work items deleted (every work item)." in messages_of(confirmed)
    assert not WorkItem.objects.filter(pk__in=[done_id, failed_id]).exists()


# --- the public API: expected_status is optional -----------------------------------------------


def test_apply_action_skips_an_item_not_in_the_expected_status():
    item_id = _failed("task-bad")
    _retried_by_someone_else(item_id)
    queued = row(item_id)
    result = apply_action(
        "delete",
        item_id,
        expected_token=None,
        expected_status="failed",
        actor="alice",
        reason="clean up",
    )
    assert not result.applied and result.old_status == "pending"
    assert result.detail == f"skipped: it is pending now, not failed {SHOWN_ELSEWHERE}"
    assert row(item_id) == queued
    assert _transitions() == [("retry", "bob")]


@pytest.mark.parametrize("expected_status", ["pending", None])
def test_apply_action_applies_in_the_expected_status_or_when_none_is_given(expected_status):
    item_id = _pending()
    kwargs = {} if expected_status is None else {"expected_status": expected_status}
    result = apply_action(
        "cancel", item_id, expected_token=None, actor="alice", reason="not needed", **kwargs
    )
    assert result.applied and result.new_status == "cancelled"
    assert row(item_id)["status"] == "cancelled"


@pytest.mark.parametrize("expected_status", ["", "deleted", "PENDING", 3, ["pending"]])
def test_apply_action_refuses_an_unknown_expected_status_and_writes_nothing(expected_status):
    item_id = _pending()
    before = row(item_id)
    with pytest.raises(InvalidInput, match="expected_status"):
        apply_action(
            "cancel",
            item_id,
            expected_token=None,
            expected_status=expected_status,
            actor="alice",
            reason="not needed",
        )
    assert row(item_id) == before
    assert _transitions() == []
