"""Cancellation: a pending item at once, a running one asked to stop, audited, with its
dependents following their policy; through the API, the admin and the command."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from leasing import LeaseManager, apply_action, cancel, enqueue, waiting_on
from leasing.models import Checkpoint
from tests.support.helpers import row
from tests.support.recovery import expire, sweep

pytestmark = pytest.mark.django_db


def _audit(item_id: str) -> dict:
    return Checkpoint.objects.get(
        work_item_id=item_id, checkpoint_type="state_transition"
    ).snapshot_data


def test_a_pending_item_is_cancelled_at_once_and_audited():
    item = enqueue("a", "noop", unique_key="k")
    result = cancel(item.pk, actor="ops", reason="customer left")
    assert (result.applied, result.old_status, result.new_status) == (True, "pending", "cancelled")
    r = row(item.pk)
    assert r["status"] == "cancelled" and r["completed_at"] is not None
    assert r["error_message"] == "Cancelled by ops: customer left"
    audit = _audit(item.pk)
    assert (audit["action"], audit["actor"], audit["reason"]) == ("cancel", "ops", "customer left")
    # Its unique key is released: a new item takes it.
    assert not enqueue("b", "noop", unique_key="k").duplicate
    assert LeaseManager("w").acquire_lease() is not None  # the new one, not the cancelled one


def test_dependents_of_a_cancelled_item_follow_their_policy():
    item = enqueue("a", "noop")
    fails = enqueue("b", "noop", depends_on=[item.pk], on_dependency_failure="fail")
    waits = enqueue("c", "noop", depends_on=[item.pk], on_dependency_failure="wait")
    cancel(item.pk, actor="ops", reason="not needed")
    assert row(fails.pk)["status"] == "failed"
    assert row(waits.pk)["status"] == "pending" and waiting_on(waits.pk).blocked
    # A new item that depends on it and fails with its dependencies fails at once.
    late = enqueue("d", "noop", depends_on=[item.pk], on_dependency_failure="fail")
    assert row(late.pk)["status"] == "failed"


def test_a_running_item_is_asked_to_stop_and_its_failed_ending_is_a_cancellation():
    item = enqueue("a", "noop", max_retries=3)
    manager = LeaseManager("w")
    lease = manager.acquire_lease()
    result = cancel(item.pk, actor="ops", reason="wrong input")
    assert (result.applied, result.new_status) == (True, "in_progress")
    assert row(item.pk)["cancel_requested_at"] is not None
    assert _audit(item.pk)["cancel_requested"] is True
    # Asked twice: said so, nothing written.
    again = cancel(item.pk, actor="ops", reason="again")
    assert not again.applied and "asked to stop already" in again.detail
    assert manager.cancel_requests() == {lease.key}
    outcome = manager.release_lease(item.pk, False, error="stopped", retry=True, token=lease.token)
    assert (outcome.status, outcome.will_retry) == ("cancelled", False)
    r = row(item.pk)
    assert (r["status"], r["retry_count"]) == ("cancelled", 0)
    assert r["error_message"] == "Cancelled as asked; the run ended with: stopped"


def test_a_run_that_completes_though_asked_to_stop_is_completed():
    item = enqueue("a", "noop")
    manager = LeaseManager("w")
    lease = manager.acquire_lease()
    cancel(item.pk, actor="ops", reason="too late")
    assert manager.release_lease(item.pk, True, token=lease.token).status == "completed"


def test_a_hand_back_of_an_item_asked_to_stop_cancels_it():
    item = enqueue("a", "noop")
    manager = LeaseManager("w")
    lease = manager.acquire_lease()
    cancel(item.pk, actor="ops", reason="stop")
    assert manager.requeue_lease(item.pk, token=lease.token).status == "cancelled"


def test_an_expired_lease_of_an_item_asked_to_stop_is_cancelled_not_retried():
    item = enqueue("a", "noop", max_retries=5)
    LeaseManager("w").acquire_lease()
    cancel(item.pk, actor="ops", reason="stop")
    expire(item.pk)
    stats = sweep().scan_and_recover()
    assert (stats.recovered, stats.failed, stats.cancelled) == (0, 0, 1)
    r = row(item.pk)
    assert (r["status"], r["retry_count"]) == ("cancelled", 0)
    assert r["error_message"].startswith("Cancelled as asked; the run ended with: its lease")
    boundary = Checkpoint.objects.get(work_item_id=item.pk, checkpoint_type="error_boundary")
    assert boundary.snapshot_data["reason"] == "cancelled"


def test_dependents_of_an_item_the_sweep_ends_cancelled_follow_their_policy():
    """Found by the model test on SQLite: the sweep's cancelled ending skipped dependents."""
    item = enqueue("a", "noop")
    LeaseManager("w").acquire_lease()
    cancel(item.pk, actor="ops", reason="stop")
    fails = enqueue("b", "noop", depends_on=[item.pk], on_dependency_failure="fail")
    waits = enqueue("c", "noop", depends_on=[item.pk], on_dependency_failure="wait")
    expire(item.pk)
    sweep().scan_and_recover()
    assert row(item.pk)["status"] == "cancelled"
    assert row(fails.pk)["status"] == "failed"
    assert row(waits.pk)["status"] == "pending" and waiting_on(waits.pk).blocked


def test_a_cancelled_item_can_be_retried_and_runs_afresh():
    item = enqueue("a", "noop")
    manager = LeaseManager("w")
    lease = manager.acquire_lease()
    cancel(item.pk, actor="ops", reason="stop")
    manager.requeue_lease(item.pk, token=lease.token)
    result = apply_action("retry", item.pk, expected_token=None, actor="ops", reason="again")
    assert result.applied and row(item.pk)["status"] == "pending"
    assert row(item.pk)["cancel_requested_at"] is None
    second = manager.acquire_lease()
    assert manager.release_lease(item.pk, False, retry=True, token=second.token).status == (
        "pending"
    )


def test_a_finished_item_is_not_cancelled():
    item = enqueue("a", "noop")
    manager = LeaseManager("w")
    lease = manager.acquire_lease()
    manager.release_lease(item.pk, True, token=lease.token)
    result = cancel(item.pk, actor="ops", reason="no")
    assert not result.applied and "it is completed" in result.detail
    assert row(item.pk)["status"] == "completed"


def test_the_command_cancels_and_says_what_became_of_each(monkeypatch):
    monkeypatch.setenv("LOGNAME", "alice")
    monkeypatch.delenv("SUDO_USER", raising=False)
    pending = enqueue("a", "noop")
    running = enqueue("b", "noop", priority=1)
    LeaseManager("w").acquire_lease()  # the running one (higher priority)
    out = StringIO()
    call_command("cancel", pending.pk, running.pk, "--reason", "cleanup", stdout=out)
    assert f"{pending.pk}: cancelled" in out.getvalue()
    assert f"{running.pk}: asked to stop (it is running)" in out.getvalue()
    assert row(pending.pk)["error_message"] == "Cancelled by alice (manage.py cancel): cleanup"
    with pytest.raises(CommandError, match="1 of 1 item"):
        call_command("cancel", "nope", "--reason", "x", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError, match="--reason"):
        call_command("cancel", pending.pk, stdout=StringIO())


@pytest.mark.parametrize(
    ("bad", "said"),
    [("x" * 256, "at most 255"), ("bad-\udcff-bytes", "'bad-\\udcff-bytes'")],
    ids=["too-long", "undecodable-argv"],
)
def test_the_command_reports_a_bad_id_and_still_cancels_the_others(bad, said):
    """A bad id in the middle is refused with its reason; it used to stop the command
    there, with the ids before it cancelled and those after it never tried."""
    first, last = enqueue("a", "noop"), enqueue("b", "noop")
    err = StringIO()
    with pytest.raises(CommandError, match="1 of 3 item"):
        call_command("cancel", first.pk, bad, last.pk, "--reason", "cleanup",
                     stdout=StringIO(), stderr=err)  # fmt: skip
    assert row(first.pk)["status"] == row(last.pk)["status"] == "cancelled"
    assert said in err.getvalue()


def test_the_command_cancels_an_id_given_twice_once():
    item = enqueue("a", "noop")
    out = StringIO()
    call_command("cancel", item.pk, item.pk, "--reason", "cleanup", stdout=out)
    assert out.getvalue().count(f"{item.pk}: cancelled") == 1  # and no "not cancelled" error
    assert row(item.pk)["status"] == "cancelled"


def test_the_admin_cancels_with_a_reason_and_the_list_filters_cancelled(operator_client):
    from tests.support.admin import changelist_url, confirm, messages_of, start_action

    item = enqueue("a", "noop")
    page = start_action(operator_client, "cancel_selected", item.pk)
    assert page.status_code == 200
    done = confirm(operator_client, page, reason="duplicate order")
    assert "1 work item cancelled or asked to stop." in messages_of(done)
    assert row(item.pk)["status"] == "cancelled"
    listed = operator_client.get(changelist_url("status__exact=cancelled")).content.decode()
    assert item.pk in listed
    detail = operator_client.get(f"/admin/leasing/workitem/{item.pk}/change/").content.decode()
    # The reason is in the item's attempts; its error field follows the payload permission.
    assert "cancel by operator: duplicate order" in detail
    assert "Cancelled by operator: duplicate order" not in detail


def test_the_documented_way_to_stop_between_steps_ends_the_item_cancelled():
    """docs/how-to/cancel.md: `raise leasing.Cancelled(...)` once `ctx.cancelled` says so."""
    import leasing
    from leasing.testing import override_handler, run_item

    def build(ctx):
        # Asked to stop while it runs (`ctx.cancelled` turns true at its next beat).
        cancel(ctx.lease.work_item_id, actor="alice", reason="changed my mind")
        raise leasing.Cancelled("stopped between chunks")

    item = enqueue("report-1", "report.build")
    with override_handler("report.build", build):
        run_item(item, raise_errors=False)
    ended = row(item.pk)
    assert ended["status"] == "cancelled"
    assert "stopped between chunks" in ended["error_message"]  # not an AttributeError
    assert "AttributeError" not in ended["error_message"]
