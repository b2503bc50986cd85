"""The admin's operator actions: force-release, force-fail, retry; their bad input.

Exercised the way a browser submits them: the action form, then the
confirmation page's form as parsed from its HTML. Runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import hashlib
import re

import django
import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.urls import reverse

from leasing import LeaseManager
from leasing.exceptions import LeaseLostError
from leasing.models import Checkpoint, WorkItem
from tests.support.admin import (
    change_url,
    changelist_url,
    claim,
    confirm,
    form_fields,
    messages_of,
    register_holders,
    shift,
    start_action,
)
from tests.support.helpers import row
from tests.support.transition_guard import arranging

pytestmark = pytest.mark.django_db


# --- the operator actions ---------------------------------------------------------


def test_force_release_confirmation_then_fenced_release(scenario, operator_client):
    lease = scenario.stale
    item_id = lease.work_item_id
    page = start_action(operator_client, "force_release_selected", item_id)
    assert page.status_code == 200
    assert "admin/leasing/workitem/operator_action_confirmation.html" in [
        t.name for t in page.templates
    ]
    fields = form_fields(page.content.decode(), "leasing-operator-form")
    assert fields[f"token-{item_id}"] == [str(lease.token)]
    assert fields[f"heartbeat-{item_id}"] == [row(item_id)["heartbeat_at"].isoformat()]
    assert row(item_id)["status"] == "in_progress"  # nothing happens before confirming

    done = confirm(operator_client, page, reason="worker-2 is wedged on a stuck NFS mount")
    assert done.status_code == 200
    assert "1 work item force-released." in messages_of(done)
    after = row(item_id)
    assert after["status"] == "pending"
    assert after["lease_holder"] is None
    assert after["retry_count"] == 0
    transition = Checkpoint.objects.get(task_id="task-stale", checkpoint_type="state_transition")
    assert transition.work_item_id == item_id
    assert transition.snapshot_data["actor"] == "operator"
    assert transition.snapshot_data["reason"] == "worker-2 is wedged on a stuck NFS mount"
    assert transition.snapshot_data["lease_token"] == lease.token
    entry = LogEntry.objects.get()
    assert entry.object_id == item_id and entry.action_flag == CHANGE
    assert entry.user.username == "operator"
    assert "worker-2 is wedged" in entry.get_change_message()

    # The old holder's release is refused by the fence.
    manager = LeaseManager("worker-2")
    with pytest.raises(LeaseLostError):
        manager.release_lease(item_id, success=True, token=lease.token)
    assert row(item_id)["status"] == "pending"


def test_force_release_skips_an_item_reclaimed_after_the_page_was_shown(scenario, operator_client):
    lease = scenario.expired
    item_id = lease.work_item_id
    page = start_action(operator_client, "force_release_selected", item_id)
    # Meanwhile the sweep re-queues it and another worker claims it.
    WorkItem.objects.filter(pk=item_id).update(
        status="pending", lease_holder=None, lease_expires_at=None
    )
    new_lease = LeaseManager("worker-9").acquire_lease(task_id_filter="task-expired")
    assert new_lease.token == lease.token + 1

    done = confirm(operator_client, page, reason="expired long ago")
    text = " ".join(messages_of(done))
    assert f"{item_id} skipped: its lease changed since the page was shown" in text
    after = row(item_id)
    assert after["status"] == "in_progress" and after["lease_holder"] == "worker-9"
    assert not Checkpoint.objects.filter(checkpoint_type="state_transition").exists()
    assert not LogEntry.objects.exists()
    # The new holder is unaffected.
    LeaseManager("worker-9").release_lease(item_id, success=True, token=new_lease.token)


def test_force_release_skips_an_item_whose_lease_was_renewed_after_the_page(
    scenario, operator_client
):
    lease = scenario.stale
    item_id = lease.work_item_id
    page = start_action(operator_client, "force_release_selected", item_id)
    # The "stale" worker was alive after all: it renews (same token, later expiry).
    LeaseManager("worker-2").renew_lease(item_id, 600, token=lease.token)

    done = confirm(operator_client, page, reason="looked stale")
    assert any("its lease was renewed since the page was shown" in m for m in messages_of(done))
    after = row(item_id)
    assert after["status"] == "in_progress" and after["lease_token"] == lease.token
    assert not LogEntry.objects.exists()


def test_force_fail_and_retry_failed(scenario, operator_client):
    ids = scenario.ids()
    page = start_action(operator_client, "force_fail_selected", ids["stuck"], ids["pending"])
    done = confirm(operator_client, page, reason="bad input batch")
    assert "2 work items force-failed." in messages_of(done)
    assert row(ids["stuck"])["status"] == "failed"
    assert row(ids["pending"])["status"] == "failed"

    page = start_action(operator_client, "retry_failed_selected", ids["failed"], ids["healthy"])
    html = page.content.decode()
    assert "1 of 2 selected items" in html  # the healthy one is not failed
    done = confirm(operator_client, page, reason="dependency fixed")
    text = messages_of(done)
    assert "1 work item sent back to pending." in text
    assert any(ids["healthy"] in m and "skipped: it is in_progress" in m for m in text)
    assert row(ids["failed"])["status"] == "pending"
    assert row(ids["failed"])["retry_count"] == 0
    assert row(ids["healthy"])["status"] == "in_progress"
    assert LogEntry.objects.count() == 3
    reasons = set(
        Checkpoint.objects.filter(checkpoint_type="state_transition").values_list(
            "snapshot_data__reason", flat=True
        )
    )
    assert reasons == {"bad input batch", "dependency fixed"}


@pytest.mark.skipif(
    django.VERSION < (6, 1), reason="Django 6.0 has no admin actions on the change form"
)
def test_action_from_the_change_form_returns_to_the_item(scenario, operator_client):
    item_id = scenario.ids()["stale"]
    page = operator_client.post(
        change_url(item_id),
        {"CHANGE_FORM-action": "force_release_selected", "_selected_action": [item_id]},
        HTTP_REFERER="http://testserver" + change_url(item_id),
    )
    assert page.status_code == 200
    fields = form_fields(page.content.decode(), "leasing-operator-form")
    fields["reason"] = ["from the item page"]
    done = operator_client.post(changelist_url(), fields)
    assert done.status_code == 302 and done["Location"].endswith(change_url(item_id))
    assert row(item_id)["status"] == "pending"


# --- bad input ---------------------------------------------------------


def test_empty_reason_is_a_form_error_and_changes_nothing(scenario, operator_client):
    item_id = scenario.ids()["stale"]
    before = row(item_id)
    page = start_action(operator_client, "force_release_selected", item_id)
    for reason in ("", "   "):
        response = confirm(operator_client, page, reason=reason)
        assert response.status_code == 200
        assert response.context["form"].errors["reason"] == [
            "Give a reason: it is recorded with the action."
        ]
        assert row(item_id) == before
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    "garble",
    [
        {"token": "abc"},
        {"token": "-1"},
        {"token": None},  # the field removed
        {"heartbeat": "yesterday"},
        {"heartbeat": None},
    ],
)
def test_garbled_hidden_fields_change_nothing_and_reshow_the_page(
    scenario, operator_client, garble
):
    item_id = scenario.ids()["stale"]
    before = row(item_id)
    page = start_action(operator_client, "force_release_selected", item_id)
    changes = {f"{name}-{item_id}": value for name, value in garble.items()}
    response = confirm(operator_client, page, reason="garbled", **changes)
    assert response.status_code == 200
    assert any("altered or is incomplete" in m for m in messages_of(response))
    # The page is shown again with the item's current lease, ready to confirm.
    fields = form_fields(response.content.decode(), "leasing-operator-form")
    assert fields[f"token-{item_id}"] == [str(before["lease_token"])]
    assert fields["reason"] == ["garbled"]
    assert row(item_id) == before
    assert not LogEntry.objects.exists()


def test_unknown_ids_get_a_clear_message_and_change_nothing(scenario, operator_client):
    before = {pk: row(pk) for pk in scenario.ids().values()}
    response = operator_client.post(
        changelist_url(),
        {
            "action": "force_release_selected",
            "_selected_action": ["01NOSUCHITEM0000000000000", "nope"],
            "_leasing_confirm": "yes",
            "reason": "cleanup",
            "token-nope": "1",
        },
        follow=True,
    )
    assert response.status_code == 200
    assert any(
        "No work item with id '01NOSUCHITEM0000000000000'" in m for m in messages_of(response)
    )
    assert {pk: row(pk) for pk in scenario.ids().values()} == before
    assert not Checkpoint.objects.filter(checkpoint_type="state_transition").exists()


def test_a_deleted_item_among_confirmed_ones_is_reported(scenario, operator_client):
    ids = scenario.ids()
    page = start_action(operator_client, "force_release_selected", ids["stale"], ids["expired"])
    from django.db import connection

    with arranging(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM checkpoints WHERE work_item_id = %s", [ids["expired"]])
        cursor.execute("DELETE FROM work_items WHERE work_item_id = %s", [ids["expired"]])
    done = confirm(operator_client, page, reason="cleanup")
    text = messages_of(done)
    assert any(f"No work item with id '{ids['expired']}'" in m for m in text)
    assert "1 work item force-released." in text
    assert row(ids["stale"])["status"] == "pending"


# --- after a force-release ------------------------------------------------------


def test_old_holder_cannot_renew_after_force_release(scenario, operator_client):
    lease = scenario.healthy
    page = start_action(operator_client, "force_release_selected", lease.work_item_id)
    confirm(operator_client, page, reason="rebalancing")
    with pytest.raises(LeaseLostError):
        LeaseManager("worker-1").renew_lease(lease.work_item_id, token=lease.token)
    assert row(lease.work_item_id)["status"] == "pending"


def test_select_all_acts_on_the_whole_filtered_list_within_a_limit(
    scenario, operator_client, monkeypatch
):
    register_holders()
    more = [claim(f"task-stale-{n}", "worker-2").work_item_id for n in range(2)]
    for item_id in more:
        shift(item_id, heartbeat_at=-300)
    stale = [scenario.stale.work_item_id, *more]
    select_all = {
        "action": "force_release_selected",
        "_selected_action": [stale[0]],  # the page's checkboxes
        "select_across": "1",
        "index": "0",
    }
    page = operator_client.post(changelist_url("lease_health=stale"), select_all)
    html = page.content.decode()
    assert "admin/leasing/workitem/bulk_confirmation.html" in [t.name for t in page.templates]
    assert "<strong>3 work items</strong> match now: work items with lease_health=stale" in html
    assert all(row(pk)["status"] == "in_progress" for pk in stale)  # nothing before confirming

    fields = form_fields(html, "leasing-bulk-form")
    fields["reason"] = ["the NFS mount is back"]
    done = operator_client.post(changelist_url("lease_health=stale"), fields, follow=True)
    assert "3 work items force-released (work items with lease_health=stale)." in messages_of(done)
    assert all(row(pk)["status"] == "pending" for pk in stale)
    assert row(scenario.healthy.work_item_id)["status"] == "in_progress"  # not in the filter
    entries = LogEntry.objects.filter(object_id__in=stale)
    assert entries.count() == 3
    assert all("bulk: work items with lease_health=stale" in e.change_message for e in entries)
    transitions = Checkpoint.objects.filter(checkpoint_type="state_transition")
    assert set(transitions.values_list("work_item_id", flat=True)) == set(stale)

    # Over the limit: the page says so, offers no confirmation, and nothing changes.
    monkeypatch.setattr("leasing.admin.bulk.BULK_LIMIT", 1)
    # (force-fail: a pending list offers no force-release)
    select_all["action"] = "force_fail_selected"
    page = operator_client.post(changelist_url("status__exact=pending"), select_all)
    html = page.content.decode()
    assert "More than 1 work items match" in html and 'id="leasing-bulk-form"' not in html
    forged = {**fields, "action": "force_fail_selected"}
    operator_client.post(changelist_url("status__exact=pending"), forged)
    assert all(row(pk)["status"] == "pending" for pk in stale)


# --- select all: a confirmation whose count was altered or is stale ---------------------------


def _stale_leases(count: int) -> list[str]:
    """`count` in-progress items whose lease health is stale (their holders alive)."""
    register_holders()
    ids = [claim(f"task-bulk-{n}", "worker-2").work_item_id for n in range(count)]
    for item_id in ids:
        shift(item_id, heartbeat_at=-300)
    return ids


def _bulk_page(client, url: str, first_id: str):
    select_all = {
        "action": "force_release_selected",
        "_selected_action": [first_id],
        "select_across": "1",
        "index": "0",
    }
    page = client.post(url, select_all)
    assert "admin/leasing/workitem/bulk_confirmation.html" in [t.name for t in page.templates]
    return page


def _nothing_written(ids: list[str]) -> None:
    assert all(row(pk)["status"] == "in_progress" for pk in ids)
    assert not LogEntry.objects.exists()
    assert not Checkpoint.objects.filter(checkpoint_type="state_transition").exists()


@pytest.mark.parametrize(
    "expected",
    [
        pytest.param("abc", id="not-a-number"),
        pytest.param("-1", id="negative"),
        pytest.param("", id="empty"),
        pytest.param(None, id="removed"),
        pytest.param("2.5", id="not-an-integer"),
        pytest.param(str(2**70), id="beyond-bigint"),
    ],
)
def test_select_all_with_an_altered_count_writes_nothing_and_says_so(operator_client, expected):
    """The hidden `expected` count is not one the page showed: nothing is applied, an
    error says what happened, and the page is shown again with the count of now (it
    used to be shown again without a word, still carrying the altered count, so no
    confirmation could ever pass)."""
    stale = _stale_leases(3)
    url = changelist_url("lease_health=stale")
    fields = form_fields(
        _bulk_page(operator_client, url, stale[0]).content.decode(), "leasing-bulk-form"
    )
    fields["reason"] = ["the NFS mount is back"]
    if expected is None:
        del fields["expected"]
    else:
        fields["expected"] = [expected]
    response = operator_client.post(url, fields, follow=True)
    assert response.status_code == 200
    [message] = [m for m in response.context["messages"]]
    assert message.level_tag == "error"
    assert "altered or is incomplete" in message.message
    assert "nothing was changed" in message.message and "confirm again" in message.message
    _nothing_written(stale)

    again = form_fields(response.content.decode(), "leasing-bulk-form")
    assert again["expected"] == ["3"] and again["reason"] == ["the NFS mount is back"]
    done = operator_client.post(url, again, follow=True)
    assert "3 work items force-released (work items with lease_health=stale)." in messages_of(done)
    assert all(row(pk)["status"] == "pending" for pk in stale)


@pytest.mark.parametrize("change", ["one more", "one fewer", "none left"])
def test_select_all_whose_selection_changed_meanwhile_writes_nothing_and_says_so(
    operator_client, change
):
    """The page showed 3 items; when it is confirmed, another matches the filter, or one
    no longer does: nothing is applied (it used to warn and act on what matched then),
    the error gives both counts, and the page is shown again with the count of now."""
    stale = _stale_leases(3)
    url = changelist_url("lease_health=stale")
    fields = form_fields(
        _bulk_page(operator_client, url, stale[0]).content.decode(), "leasing-bulk-form"
    )
    fields["reason"] = ["the NFS mount is back"]
    assert fields["expected"] == ["3"]
    if change == "one more":
        stale += _stale_leases(1)
    elif change == "one fewer":
        shift(stale.pop(), heartbeat_at=0)  # renewed: healthy again
    else:
        for item_id in stale:
            shift(item_id, heartbeat_at=0)
    now = len(stale) if change != "none left" else 0
    response = operator_client.post(url, fields, follow=True)
    assert response.status_code == 200
    [message] = [m for m in response.context["messages"]]
    assert message.level_tag == "error"
    assert "changed after the page was shown" in message.message
    assert f"{now} work item{'s' if now != 1 else ''} match{'' if now != 1 else 'es'} now" in (
        message.message
    )
    assert "3 did then" in message.message and "nothing was changed" in message.message
    _nothing_written(stale)

    html = response.content.decode()
    if not now:
        assert "No work item matches" in html and 'id="leasing-bulk-form"' not in html
        return
    again = form_fields(html, "leasing-bulk-form")
    assert again["expected"] == [str(now)] and again["reason"] == ["the NFS mount is back"]
    done = operator_client.post(url, again, follow=True)
    assert f"{now} work items force-released" in messages_of(done)[0]
    assert all(row(pk)["status"] == "pending" for pk in stale)


def _fingerprint(ids: list[str], status: str) -> str:
    """The fingerprint a confirmation page must carry for these items (of any order), all
    in `status`, with the lease tokens they have now."""
    lines = sorted(f"{pk} {status} {row(pk)['lease_token']}" for pk in ids)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def test_select_all_confirmation_carries_the_fingerprint_of_its_items_and_applies(
    operator_client,
):
    """The page carries which items it showed, not only how many, and confirming it
    unchanged applies the action to those items."""
    stale = _stale_leases(3)
    url = changelist_url("lease_health=stale")
    fields = form_fields(
        _bulk_page(operator_client, url, stale[0]).content.decode(), "leasing-bulk-form"
    )
    assert fields["expected"] == ["3"]
    assert fields["fingerprint"] == [_fingerprint(stale, "in_progress")]
    fields["reason"] = ["the NFS mount is back"]
    done = operator_client.post(url, fields, follow=True)
    assert messages_of(done) == [
        "3 work items force-released (work items with lease_health=stale)."
    ]
    assert all(row(pk)["status"] == "pending" for pk in stale)
    assert LogEntry.objects.filter(object_id__in=stale).count() == 3


@pytest.mark.parametrize("replaced", [1, 3])
def test_select_all_whose_items_changed_to_as_many_others_writes_nothing_and_says_so(
    operator_client, replaced
):
    """The page showed 3 items; when it is confirmed, 3 items match again but not the same
    ones (some renewed their lease, as many others went stale): nothing is applied (the
    count alone let it act on items the operator never saw), the error says so, and the
    page is shown again with the fingerprint of now, which then applies to those."""
    shown = _stale_leases(3)
    url = changelist_url("lease_health=stale")
    fields = form_fields(
        _bulk_page(operator_client, url, shown[0]).content.decode(), "leasing-bulk-form"
    )
    fields["reason"] = ["the NFS mount is back"]
    register_holders()
    others = [claim(f"task-other-{n}", "worker-2").work_item_id for n in range(replaced)]
    for item_id in others:
        shift(item_id, heartbeat_at=-300)
    for item_id in shown[:replaced]:
        shift(item_id, heartbeat_at=0)  # renewed: healthy again
    now = [*shown[replaced:], *others]
    everything = [*shown, *others]
    before = {pk: row(pk) for pk in everything}

    response = operator_client.post(url, fields, follow=True)
    assert response.status_code == 200
    [message] = [m for m in response.context["messages"]]
    assert message.level_tag == "error"
    assert message.message == (
        "The selection changed after the page was shown: 3 work items match now, as many as "
        "then, but not the same ones, or not in the same status or lease (work items with "
        "lease_health=stale); nothing was changed. Check the items and confirm again."
    )
    assert {pk: row(pk) for pk in everything} == before  # each item as it was
    _nothing_written(everything)

    again = form_fields(response.content.decode(), "leasing-bulk-form")
    assert again["expected"] == ["3"] and again["reason"] == ["the NFS mount is back"]
    assert again["fingerprint"] == [_fingerprint(now, "in_progress")] != fields["fingerprint"]
    done = operator_client.post(url, again, follow=True)
    assert "3 work items force-released (work items with lease_health=stale)." in messages_of(done)
    assert all(row(pk)["status"] == "pending" for pk in now)
    assert all(row(pk)["status"] == "in_progress" for pk in shown[:replaced])


@pytest.mark.parametrize(
    "fingerprint",
    [
        pytest.param(None, id="removed"),
        pytest.param("", id="empty"),
        pytest.param("not-a-fingerprint", id="not-hex"),
        pytest.param("0123456789abcde", id="too-short"),
        pytest.param("0123456789abcdef0", id="too-long"),
        pytest.param("0123456789ABCDEF", id="upper-case"),
        pytest.param("0123456789abcdef\n", id="trailing-newline"),
        pytest.param(" 0123456789abcdef", id="padded"),
        pytest.param("é" * 16, id="not-ascii"),
    ],
)
def test_select_all_with_an_altered_fingerprint_writes_nothing_and_says_so(
    operator_client, fingerprint
):
    """A fingerprint the page cannot have shown (lost or malformed) is an altered page,
    whatever the count: nothing is applied, never a 500, and the page is shown again
    with the fingerprint of now."""
    stale = _stale_leases(3)
    url = changelist_url("lease_health=stale")
    fields = form_fields(
        _bulk_page(operator_client, url, stale[0]).content.decode(), "leasing-bulk-form"
    )
    fields["reason"] = ["the NFS mount is back"]
    if fingerprint is None:
        del fields["fingerprint"]
    else:
        fields["fingerprint"] = [fingerprint]
    response = operator_client.post(url, fields, follow=True)
    assert response.status_code == 200
    [message] = [m for m in response.context["messages"]]
    assert message.level_tag == "error"
    assert "altered or is incomplete" in message.message and "fingerprint" in message.message
    assert "nothing was changed" in message.message and "confirm again" in message.message
    _nothing_written(stale)

    again = form_fields(response.content.decode(), "leasing-bulk-form")
    assert again["expected"] == ["3"]
    assert again["fingerprint"] == [_fingerprint(stale, "in_progress")]
    done = operator_client.post(url, again, follow=True)
    assert "3 work items force-released (work items with lease_health=stale)." in messages_of(done)
    assert all(row(pk)["status"] == "pending" for pk in stale)


def _failed(task_id: str) -> str:
    lease = claim(task_id, "w-1", max_retries=0)
    LeaseManager("w-1").release_lease(
        lease.work_item_id, False, error=ValueError("lookup down"), token=lease.token
    )
    return lease.work_item_id


@pytest.mark.parametrize("expected", ["abc", "2", "4"])
def test_retrying_an_error_group_with_an_altered_or_stale_count_writes_nothing(
    operator_client, expected
):
    """The error group's "retry this group" confirmation is the same bulk page: a count
    altered (or one the group no longer has) is refused with an error, never applied."""
    ids = [_failed(f"task-group-{n}") for n in range(3)]
    errors = operator_client.get(reverse("admin:leasing_workitem_errors")).content.decode()
    retry_url = re.search(r'href="([^"]*errors/retry/\?[^"]*)"', errors)[1].replace("&amp;", "&")
    fields = form_fields(operator_client.get(retry_url).content.decode(), "leasing-bulk-form")
    assert fields["expected"] == ["3"]
    fields |= {"reason": ["the lookup service is back"], "expected": [expected]}
    response = operator_client.post(retry_url, fields, follow=True)
    assert response.status_code == 200
    [message] = [m for m in response.context["messages"]]
    assert message.level_tag == "error" and "nothing was changed" in message.message
    assert all(row(pk)["status"] == "failed" for pk in ids)
    assert not LogEntry.objects.exists()

    again = form_fields(response.content.decode(), "leasing-bulk-form")
    assert again["expected"] == ["3"]
    operator_client.post(retry_url, again)
    assert all(row(pk)["status"] == "pending" for pk in ids)


def test_retrying_an_error_group_whose_items_changed_to_as_many_others_writes_nothing(
    operator_client,
):
    """The group's page showed 3 failed items; meanwhile those 3 were retried and 3 others
    failed with the same error: as many items match, but not the ones shown. Nothing is
    retried (the count alone retried the 3 the operator never saw), the error says so,
    and the page is shown again with the items of now, whose confirmation retries them."""
    shown = [_failed(f"task-group-{n}") for n in range(3)]
    errors = operator_client.get(reverse("admin:leasing_workitem_errors")).content.decode()
    retry_url = re.search(r'href="([^"]*errors/retry/\?[^"]*)"', errors)[1].replace("&amp;", "&")
    fields = form_fields(operator_client.get(retry_url).content.decode(), "leasing-bulk-form")
    assert fields["expected"] == ["3"] and fields["fingerprint"] == [_fingerprint(shown, "failed")]
    fields["reason"] = ["the lookup service is back"]
    # Another operator retries the 3 items one by one; 3 others fail the same way.
    page = start_action(operator_client, "retry_failed_selected", *shown)
    retried = confirm(operator_client, page, reason="retried one by one")
    assert "3 work items sent back to pending." in messages_of(retried)
    others = [_failed(f"task-other-{n}") for n in range(3)]
    everything = [*shown, *others]
    before = {pk: row(pk) for pk in everything}
    entries = LogEntry.objects.count()
    transitions = Checkpoint.objects.filter(checkpoint_type="state_transition").count()

    response = operator_client.post(retry_url, fields, follow=True)
    assert response.status_code == 200
    [message] = [m for m in response.context["messages"]]
    assert message.level_tag == "error"
    assert "3 work items match now, as many as then, but not the same ones" in message.message
    assert "nothing was changed" in message.message
    assert {pk: row(pk) for pk in everything} == before  # each item as it was
    assert all(row(pk)["status"] == "failed" for pk in others)
    assert LogEntry.objects.count() == entries
    assert Checkpoint.objects.filter(checkpoint_type="state_transition").count() == transitions

    again = form_fields(response.content.decode(), "leasing-bulk-form")
    assert again["expected"] == ["3"] and again["fingerprint"] == [_fingerprint(others, "failed")]
    assert again["reason"] == ["the lookup service is back"]
    operator_client.post(retry_url, again)
    assert all(row(pk)["status"] == "pending" for pk in others)
