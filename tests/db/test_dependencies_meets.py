"""Dependencies meet operator actions, cancellation, retention and unique keys
(SQLite and PostgreSQL).

Each combination ends as `docs/how-to/dependencies.md` says: dependents fail or
wait as their `on_dependency_failure` chose, nothing is left blocked without a
word, and the console shows a blocked item as blocked, never as claimable.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest

from leasing import LeaseManager, apply_action, cancel, enqueue, enqueue_many, waiting_on
from leasing.exceptions import InvalidInput, UnknownDependency
from leasing.models import Checkpoint, WorkItem, WorkItemDependency
from leasing.services.enqueue_rules import MAX_DEPENDENCIES
from leasing.services.retention import purge_finished_items
from tests.support.admin import (
    change_url,
    changelist_url,
    confirm,
    dashboard_url,
    form_fields,
    messages_of,
    start_action,
)
from tests.support.helpers import database_now, row
from tests.support.items import claimable_ids, get, run_item
from tests.support.transition_guard import arranging

pytestmark = pytest.mark.django_db


def act(action: str, item: Any, **kwargs: Any) -> Any:
    return apply_action(
        action, get(item).pk, expected_token=None, actor="ops", reason="test", **kwargs
    )


def age_finished(*items: Any) -> None:
    with arranging():
        WorkItem.objects.filter(pk__in=[get(i).pk for i in items]).update(
            completed_at=database_now() - timedelta(days=2)
        )


# --- operators on a parent while children wait -----------------------------------------------


def test_a_cancelled_running_parent_fails_its_dependents_when_its_run_ends():
    parent = enqueue("parent", "w", max_retries=3)
    fails = enqueue("fails", "w", depends_on=[parent])
    waits = enqueue("waits", "w", depends_on=[parent], on_dependency_failure="wait")
    manager = LeaseManager("w1")
    lease = manager.acquire_lease(60)
    assert cancel(parent.pk, actor="ops", reason="stop").new_status == "in_progress"
    # Asked to stop only: the dependents still wait for its run.
    assert (get(fails).status, get(waits).status) == ("pending", "pending")
    outcome = manager.release_lease(
        parent.pk, False, error="stopped", retry=True, token=lease.token
    )
    assert outcome.status == "cancelled"
    assert (get(fails).status, get(fails).error_message) == (
        "failed",
        f"dependency failed: {parent.pk}",
    )
    assert (get(waits).status, get(waits).dependencies_left) == ("pending", 1)


def test_a_force_released_parent_leaves_its_dependents_blocked_until_it_completes():
    parent = enqueue("parent", "w")
    child = enqueue("child", "w", depends_on=[parent])
    LeaseManager("dead").acquire_lease(60)
    result = act("force_release", parent)
    assert (result.applied, result.new_status) == (True, "pending")
    assert (get(child).status, get(child).dependencies_left) == ("pending", 1)
    run_item(parent)
    assert claimable_ids() == {child.pk}


def test_a_retried_parent_says_which_dependents_stay_failed_and_they_run_once_retried():
    """Found probing retries: a parent retried after its dependents failed with it ran
    and completed, and its dependents stayed failed with nothing saying so."""
    parent = enqueue("parent", "w")
    a, b = enqueue_many(
        [
            {"task_id": "a", "work_type": "w", "depends_on": [parent]},
            {"task_id": "b", "work_type": "w", "depends_on": [parent]},
        ]
    )
    grandchild = enqueue("g", "w", depends_on=[a], on_dependency_failure="wait")
    run_item(parent, success=False)
    assert get(a).status == get(b).status == "failed"

    retried = act("retry", parent)
    assert retried.applied
    assert "2 dependent item(s) that failed with their dependencies stay failed" in retried.detail
    record = Checkpoint.objects.filter(
        work_item_id=parent.pk, checkpoint_type="state_transition"
    ).get()
    assert record.snapshot_data["dependents_still_failed"] == 2
    run_item(parent)
    # The completion counts the parent off every dependent, failed ones too...
    assert (get(a).status, get(a).dependencies_left) == ("failed", 0)
    # ...but only an operator's retry runs them (and then the grandchild).
    assert get(grandchild).status == "pending" and grandchild.pk not in claimable_ids()
    assert act("retry", a).applied and act("retry", b).applied
    assert claimable_ids() == {a.pk, b.pk}
    run_item(a)
    assert claimable_ids() == {b.pk, grandchild.pk}


def test_a_retry_of_a_parent_nobody_failed_with_adds_nothing_to_its_detail():
    parent = enqueue("parent", "w")
    waits = enqueue("waits", "w", depends_on=[parent], on_dependency_failure="wait")
    run_item(parent, success=False)
    retried = act("retry", parent)
    assert retried.applied and "stay failed" not in retried.detail
    assert (get(waits).status, get(waits).dependencies_left) == ("pending", 1)


def test_deleting_a_failed_parent_a_dependent_waits_for_suggests_what_applies():
    """Found probing deletes: the refusal told the operator to cancel a failed item,
    which cannot be cancelled."""
    parent = enqueue("parent", "w")
    waits = enqueue("waits", "w", depends_on=[parent], on_dependency_failure="wait")
    run_item(parent, success=False)
    refused = act("delete", parent)
    assert not refused.applied
    assert "1 unfinished item(s) depend on it" in refused.detail
    assert "retry it, or cancel or force-fail them first" in refused.detail
    assert "cancel it instead" not in refused.detail
    # Following the advice: the waiting dependent cancelled, the delete goes through.
    assert cancel(waits.pk, actor="ops", reason="not needed").applied
    assert act("delete", parent).applied
    assert WorkItemDependency.objects.filter(dependency=parent.pk).count() == 0


# --- retention ----------------------------------------------------------------------------


def test_purging_a_completed_parent_never_strands_a_dependent_still_waiting_for_another():
    done, slow = enqueue("done", "w"), enqueue("slow", "w")
    join = enqueue("join", "w", depends_on=[done, slow])
    run_item(done)
    age_finished(done)
    assert purge_finished_items(timedelta(days=1)).items_deleted == 1
    assert waiting_on(join.pk).left == 1  # only `slow` is waited for
    run_item(slow)
    assert claimable_ids() == {join.pk}


def test_a_cancelled_parent_a_waiting_dependent_needs_is_kept_by_the_purge():
    parent = enqueue("parent", "w")
    waits = enqueue("waits", "w", depends_on=[parent], on_dependency_failure="wait")
    cancel(parent.pk, actor="ops", reason="later")
    age_finished(parent)
    assert purge_finished_items(timedelta(days=1)).items_deleted == 0
    assert act("retry", parent).applied
    run_item(parent)
    assert claimable_ids() == {waits.pk}


def test_a_dependency_that_was_purged_is_an_unknown_dependency():
    parent = enqueue("parent", "w")
    run_item(parent)
    age_finished(parent)
    assert purge_finished_items(timedelta(days=1)).items_deleted == 1
    with pytest.raises(UnknownDependency, match=parent.pk):
        enqueue("child", "w", depends_on=[parent.pk])
    assert WorkItem.objects.count() == 0


# --- enqueueing against parents in every state ------------------------------------------


def test_a_dependency_already_cancelled_fails_the_new_item_at_once_or_leaves_it_waiting():
    parent = enqueue("parent", "w")
    cancel(parent.pk, actor="ops", reason="no")
    fails = enqueue("fails", "w", depends_on=[parent])
    waits = enqueue("waits", "w", depends_on=[parent], on_dependency_failure="wait")
    assert (fails.status, get(fails).error_message) == ("failed", f"dependency failed: {parent.pk}")
    assert (get(waits).status, get(waits).dependencies_left) == ("pending", 1)


def test_repeated_dependencies_count_once():
    parent = enqueue("parent", "w")
    child = enqueue("child", "w", depends_on=[parent, parent.pk, get(parent)])
    assert get(child).dependencies_left == 1
    assert WorkItemDependency.objects.filter(dependent=child.pk).count() == 1
    run_item(parent)
    assert claimable_ids() == {child.pk}


def test_more_dependencies_than_the_limit_are_refused_before_anything_is_read():
    ids = [f"id-{i}" for i in range(MAX_DEPENDENCIES + 1)]
    with pytest.raises(InvalidInput, match=f"more than {MAX_DEPENDENCIES}"):
        enqueue("child", "w", depends_on=ids)
    assert WorkItem.objects.count() == 0


def test_a_blocked_holder_of_a_unique_key_answers_for_it_and_releases_it_when_it_fails():
    parent = enqueue("parent", "w")
    holder = enqueue("holder", "w", unique_key="k", depends_on=[parent])
    again = enqueue("again", "w", unique_key="k")
    assert again.duplicate and again.pk == holder.pk
    assert act("force_fail", parent).applied
    assert get(holder).status == "failed"
    fresh = enqueue("fresh", "w", unique_key="k")
    assert not fresh.duplicate and claimable_ids() == {fresh.pk}
    # The failed holder is not retried while the new one holds its key.
    refused = act("retry", holder)
    assert not refused.applied


# --- what the console shows ---------------------------------------------------------------


def test_waiting_on_lists_a_cancelled_dependency_with_the_unfinished_ones():
    """Found probing the reads: a cancelled dependency was listed with the completed
    ones (after them by id, so a limit could hide it) and not among `failed`."""
    done = enqueue("done", "w")
    run_item(done)
    later = enqueue("later", "w")
    stopped = enqueue("stopped", "w")
    cancel(stopped.pk, actor="ops", reason="no")
    waits = enqueue("waits", "w", depends_on=[done, later, stopped], on_dependency_failure="wait")
    state = waiting_on(waits.pk)
    assert [(i.work_item_id, i.status) for i in state.items] == [
        (stopped.pk, "cancelled"),
        (later.pk, "pending"),
        (done.pk, "completed"),
    ]
    assert [i.work_item_id for i in state.failed] == [stopped.pk]
    assert waiting_on(waits.pk, limit=1).items[0].work_item_id == stopped.pk


def test_the_console_shows_blocked_items_as_blocked(viewer_client):
    """Found probing the console: the queue table showed blocked items as plain pending
    (no claimable count), and the list and item page as "Pending" like claimable ones."""
    parent = enqueue("parent", "w", queue_name="chain")
    children = enqueue_many(
        [{"task_id": f"c{i}", "work_type": "w", "queue_name": "chain", "depends_on": [parent]}
         for i in range(3)]
    )  # fmt: skip
    html = viewer_client.get(dashboard_url()).content.decode()
    queue_row = html.split('data-queue="chain"')[1].split("</tr>")[0]
    assert 'data-blocked="3"' in queue_row
    assert "1 claimable" in queue_row and "3 waiting for dependencies" in queue_row

    page = viewer_client.get(change_url(children[0].pk)).content.decode()
    assert "waiting for 1 dependency" in page
    listing = viewer_client.get(changelist_url("status__exact=pending")).content.decode()
    assert listing.count("waiting for 1 dependency") == 3
    assert "leasing-status-blocked" not in viewer_client.get(change_url(parent.pk)).content.decode()

    # Failed with their parent, they are no longer counted blocked.
    act("force_fail", parent)
    html = viewer_client.get(dashboard_url()).content.decode()
    queue_rows = html.split('data-queue="chain"')[1:]
    assert not any("waiting for dependencies" in r.split("</tr>")[0] for r in queue_rows)
    listing = viewer_client.get(changelist_url()).content.decode()
    assert "waiting for 1 dependency" not in listing
    assert {row(c.pk)["status"] for c in children} == {"failed"}


def test_the_admin_says_what_an_action_did_to_the_dependents(operator_client):
    """Found probing the admin: a force-fail that failed dependents and a retry that
    left them failed said nothing about them (their result's detail was not shown)."""
    parent = enqueue("parent", "w")
    children = enqueue_many(
        [{"task_id": f"c{i}", "work_type": "w", "depends_on": [parent]} for i in range(2)]
    )
    page = start_action(operator_client, "force_fail_selected", parent.pk)
    text = messages_of(confirm(operator_client, page, reason="bad input"))
    assert any(parent.pk in m and "2 dependent item(s) failed with it" in m for m in text), text
    assert {row(c.pk)["status"] for c in children} == {"failed"}

    page = start_action(operator_client, "retry_failed_selected", parent.pk)
    text = messages_of(confirm(operator_client, page, reason="fixed"))
    assert any(parent.pk in m and "2 dependent item(s)" in m and "stay failed" in m for m in text)

    # Over a filtered list (select all), the counts are summed.
    act("force_fail", parent)
    select_all = {
        "action": "retry_failed_selected",
        "_selected_action": [parent.pk],
        "select_across": "1",
        "index": "0",
    }
    page = operator_client.post(changelist_url(f"q={parent.task_id}"), select_all)
    fields = form_fields(page.content.decode(), "leasing-bulk-form")
    fields["reason"] = ["fixed again"]
    done = operator_client.post(changelist_url(f"q={parent.task_id}"), fields, follow=True)
    assert any("2 dependent item(s)" in m and "stay failed" in m for m in messages_of(done))


def test_retrying_a_failed_graph_at_once_retries_dependencies_before_their_dependents(
    operator_client,
):
    """Found probing the admin: retrying a parent and the children that failed with it
    in one action skipped the children the list happened to hold before their parent."""
    # The children come first (lower ids): they name their parent by its position.
    *children, parent = enqueue_many(
        [{"task_id": "graph", "work_type": "w", "depends_on": [2]} for _ in range(2)]
        + [{"task_id": "graph", "work_type": "w"}]
    )
    assert max(c.pk for c in children) < parent.pk
    act("force_fail", parent)
    page = start_action(operator_client, "retry_failed_selected", *[c.pk for c in children])
    text = messages_of(confirm(operator_client, page, reason="children alone"))
    assert all(row(c.pk)["status"] == "failed" for c in children), text  # still refused

    page = start_action(operator_client, "retry_failed_selected", children[0].pk, parent.pk)
    text = messages_of(confirm(operator_client, page, reason="parent and one child"))
    assert (row(parent.pk)["status"], row(children[0].pk)["status"]) == ("pending", "pending"), text

    act("force_fail", parent)  # fails both children again
    select_all = {
        "action": "retry_failed_selected",
        "_selected_action": [parent.pk],
        "select_across": "1",
        "index": "0",
    }
    page = operator_client.post(changelist_url("q=graph"), select_all)
    fields = form_fields(page.content.decode(), "leasing-bulk-form")
    fields["reason"] = ["the whole graph"]
    done = operator_client.post(changelist_url("q=graph"), fields, follow=True)
    assert not any("skipped" in m for m in messages_of(done)), messages_of(done)
    assert {row(i.pk)["status"] for i in [*children, parent]} == {"pending"}
    assert claimable_ids() == {parent.pk}


def test_an_items_page_shows_what_it_waits_for_and_what_waits_for_it(viewer_client):
    """Found probing the console: an item's page showed nothing of its dependencies, so
    an item blocked for good behind a failed one looked like any other pending item."""
    done, parent = enqueue("done", "w"), enqueue("parent", "w")
    run_item(done)
    waits = enqueue("waits", "w", depends_on=[done, parent], on_dependency_failure="wait")
    run_item(parent, success=False)

    page = viewer_client.get(change_url(waits.pk)).content.decode()
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert (
        f"1 of 2 not completed; 1 failed or cancelled: it stays blocked until that one is "
        f"retried: {parent.pk} (failed), {done.pk} (completed)"
    ) in text
    assert change_url(parent.pk) in page
    page = viewer_client.get(change_url(parent.pk)).content.decode()
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert f"1 item(s): {waits.pk} (pending)" in text
    # An item with no dependencies and no dependents has no such section.
    lone = enqueue("lone", "w")
    assert "waits for" not in viewer_client.get(change_url(lone.pk)).content.decode()
