"""Item actions by status (issue 42): only the actions that apply are offered, on the
item page and on a list filtered by status; delete and run now through the admin.

Driven the way a browser submits them (the action form, then the confirmation
page's form). Runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import re

import django
import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.urls import reverse

from leasing import enqueue
from leasing.models import Checkpoint, WorkItem
from tests.support.admin import (
    ITEM_MENU,
    change_url,
    changelist_url,
    confirm,
    messages_of,
    shift,
    start_action,
)
from tests.support.helpers import database_now, row

pytestmark = pytest.mark.django_db

EVERY_ACTION = {
    "force_release_selected",
    "force_fail_selected",
    "retry_failed_selected",
    "cancel_selected",
    "delete_items_selected",
    "run_now_selected",
}


def offered(html: str, select_name: str) -> set[str]:
    """The actions a page's action menu offers (its non-empty options)."""
    match = re.search(rf'<select name="{select_name}"[^>]*>(.*?)</select>', html, re.S)
    if match is None:
        return set()
    return {v for v in re.findall(r'<option value="([^"]*)"', match.group(1)) if v}


needs_change_form_actions = pytest.mark.skipif(
    django.VERSION < (6, 1), reason="Django 6.0 has no admin actions on the change form"
)


def test_the_item_page_offers_only_the_actions_of_the_items_status(scenario, operator_client):
    ids = scenario.ids()
    deferred = enqueue("task-deferred", "noop", run_after=database_now().replace(year=2099))
    expected = {
        ids["healthy"]: {"force_release_selected", "force_fail_selected", "cancel_selected"},
        ids["pending"]: {"force_fail_selected", "cancel_selected", "delete_items_selected"},
        deferred.pk: {
            "force_fail_selected",
            "cancel_selected",
            "delete_items_selected",
            "run_now_selected",
        },
        ids["failed"]: {"retry_failed_selected", "delete_items_selected"},
        ids["completed"]: {"delete_items_selected"},
    }
    for item_id, actions in expected.items():
        html = operator_client.get(change_url(item_id)).content.decode()
        assert offered(html, ITEM_MENU) == actions, (row(item_id)["status"], html)
        # One menu: where Django offers change-form actions, the console adds none.
        assert ('id="leasing-item-actions"' in html) == (django.VERSION < (6, 1))


def test_a_running_item_asked_to_stop_is_not_offered_cancel_again(scenario, operator_client):
    item_id = scenario.ids()["healthy"]
    shift(item_id, cancel_requested_at=-1)
    html = operator_client.get(change_url(item_id)).content.decode()
    assert offered(html, ITEM_MENU) == {"force_release_selected", "force_fail_selected"}


def test_the_list_offers_the_actions_of_the_status_it_is_filtered_by(scenario, operator_client):
    def menu(query: str) -> set[str]:
        return offered(operator_client.get(changelist_url(query)).content.decode(), "action")

    assert menu("") == EVERY_ACTION
    assert menu("status__exact=failed") == {"retry_failed_selected", "delete_items_selected"}
    assert menu("status__exact=completed") == {"delete_items_selected"}
    assert menu("status__exact=in_progress") == {
        "force_release_selected",
        "force_fail_selected",
        "cancel_selected",
    }
    assert "run_now_selected" in menu("status__exact=pending")
    assert menu("lease_health=stale") == menu("status__exact=in_progress")


def test_a_viewer_is_offered_no_action(scenario, viewer_client):
    html = viewer_client.get(change_url(scenario.ids()["pending"])).content.decode()
    assert offered(html, ITEM_MENU) == set()
    assert offered(viewer_client.get(changelist_url()).content.decode(), "action") == set()


def test_delete_removes_pending_and_finished_items_audited_and_skips_a_running_one(
    scenario, operator_client
):
    ids = scenario.ids()
    page = start_action(
        operator_client, "delete_items_selected", ids["pending"], ids["completed"], ids["healthy"]
    )
    assert page.status_code == 200
    assert "2 of 3 selected items" in page.content.decode()
    done = confirm(operator_client, page, reason="test data from the load run")
    text = messages_of(done)
    assert "2 work items deleted." in text
    assert any(ids["healthy"] in m and "skipped: it is in_progress" in m for m in text)
    assert not WorkItem.objects.filter(pk__in=[ids["pending"], ids["completed"]]).exists()
    assert row(ids["healthy"])["status"] == "in_progress"
    # The audit trail: a checkpoint on the task tied to no item, and an admin log entry.
    record = Checkpoint.objects.get(task_id="task-pending", checkpoint_type="state_transition")
    assert record.work_item_id is None
    assert record.snapshot_data["action"] == "delete"
    assert record.snapshot_data["work_item_id"] == ids["pending"]
    assert record.snapshot_data["old_status"] == "pending"
    assert record.snapshot_data["reason"] == "test data from the load run"
    entries = LogEntry.objects.filter(action_flag=DELETION)
    assert {e.object_id for e in entries} == {ids["pending"], ids["completed"]}
    assert all("test data from the load run" in e.change_message for e in entries)


def test_delete_skips_an_item_that_unfinished_items_wait_for(operator_client):
    first = enqueue("task-chain", "noop")
    enqueue("task-chain", "noop", depends_on=[first.pk])
    page = start_action(operator_client, "delete_items_selected", first.pk)
    done = confirm(operator_client, page, reason="cleanup")
    text = messages_of(done)
    assert any("1 unfinished item(s) depend on it" in m for m in text), text
    assert row(first.pk)["status"] == "pending"
    assert not LogEntry.objects.exists()


def test_run_now_makes_a_deferred_item_due_and_skips_one_already_due(scenario, operator_client):
    deferred = enqueue("task-later", "noop", run_after=database_now().replace(year=2099))
    due = scenario.ids()["pending"]
    page = start_action(operator_client, "run_now_selected", deferred.pk, due)
    assert "1 of 2 selected items" in page.content.decode()
    done = confirm(operator_client, page, reason="the partner API is back")
    text = messages_of(done)
    assert "1 work item made due now." in text
    assert any(due in m and "it is due already" in m for m in text), text
    after = row(deferred.pk)
    assert after["status"] == "pending"
    assert after["run_after"] <= database_now()
    record = Checkpoint.objects.get(task_id="task-later", checkpoint_type="state_transition")
    assert record.snapshot_data["action"] == "run_now"


@needs_change_form_actions
def test_an_action_that_does_not_apply_posted_anyway_changes_nothing(scenario, operator_client):
    """A hand-made POST of "retry" on a running item: a clear message, never a 500."""
    item_id = scenario.ids()["healthy"]
    page = operator_client.post(
        change_url(item_id),
        {"CHANGE_FORM-action": "retry_failed_selected", "_selected_action": [item_id]},
    )
    assert page.status_code in (200, 302)
    if page.status_code == 200 and "leasing-operator-form" in page.content.decode():
        assert "0 of 1 selected item" in page.content.decode()
        done = confirm(operator_client, page, reason="no")
        assert any("skipped: it is in_progress" in m for m in messages_of(done))
    assert row(item_id)["status"] == "in_progress"


def test_a_deletion_stays_on_its_tasks_timeline_for_every_viewer(viewer_client):
    from leasing import apply_action

    item = enqueue("task-gone", "noop")
    result = apply_action(
        "delete", item.pk, expected_token=0, actor="alice", reason="a duplicate of 42"
    )
    assert result.applied and result.new_status == "deleted"
    html = viewer_client.get(reverse("admin:leasing_workitem_timeline", args=["task-gone"]))
    text = html.content.decode()
    assert f"delete of {item.pk} (was pending) by alice: a duplicate of 42" in text
