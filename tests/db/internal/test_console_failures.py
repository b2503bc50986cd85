"""Failures readable in one click: last error, attempt history, top errors, retry a group."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.test import Client

from leasing import LeaseManager, RecoverySweep, apply_action, enqueue
from leasing.console.failures import error_groups, item_failures, normalise
from leasing.models import Checkpoint, WorkItem
from tests.support.admin import (
    FORCE,
    PAYLOAD,
    VIEW_ALL,
    change_url,
    claim,
    form_fields,
    make_user,
    shift,
)
from tests.support.helpers import database_now
from tests.support.workers import FAST_POLL, parse_summary

pytestmark = pytest.mark.django_db

ERRORS_URL = "/admin/leasing/workitem/errors/"


def client_with(*perms: str) -> Client:
    client = Client()
    client.force_login(make_user("u-" + "-".join(p.split(".")[1] for p in perms), *perms))
    return client


def failed(task_id: str, error: Exception, work_type: str = "noop") -> str:
    """An item that failed for good with `error` (no retries left)."""
    lease = claim(task_id, "w-1", work_type=work_type, max_retries=0)
    LeaseManager("w-1").release_lease(lease.work_item_id, False, error=error, token=lease.token)
    return lease.work_item_id


@pytest.mark.django_db(transaction=True)
def test_the_item_page_shows_the_traceback_and_every_attempt(leasing_settings):
    leasing_settings(RETRY_BACKOFF_BASE=0.01, **FAST_POLL)
    item = enqueue("d", "test.always_fail", max_retries=2)
    out = StringIO()
    call_command("runworker", "--burst", stdout=out)
    worker_id = parse_summary(out.getvalue())["worker_id"]

    html = client_with(*VIEW_ALL, PAYLOAD).get(change_url(item.pk)).content.decode()
    last = re.search(r'<section class="module leasing-last-error".*?</section>', html, re.S)[0]
    assert "ValueError: this always fails" in last and "builtins.ValueError" in last
    traceback = re.search(r'<pre class="leasing-traceback" id="leasing-traceback">(.*?)</pre>',
                          last, re.S)[1]  # fmt: skip
    assert traceback.startswith("Traceback (most recent call last):")
    assert "raise ValueError(&quot;this always fails&quot;)" in traceback
    attempts = re.search(r'<section class="module" id="leasing-attempts".*?</section>', html, re.S)[
        0
    ]
    rows = re.findall(r'<tr class="leasing-attempt-(\w+)">\s*<td class="num">(\d+)</td>', attempts)
    assert rows == [("warn", "1"), ("warn", "2"), ("bad", "3")]
    assert attempts.count(f">{worker_id}</a>") == 3  # linked to the worker's page
    assert attempts.count("handler failed: retry scheduled") == 2
    assert "handler failed: no retries left" in attempts

    # Without the payload permission: the attempts, but no error text or traceback.
    html = client_with(*VIEW_ALL).get(change_url(item.pk)).content.decode()
    assert (
        "leasing-traceback" not in html
        and "this always fails" not in html.split('id="leasing-attempts"')[1].split("</section>")[0]
    )
    assert "need the “Can view work item and checkpoint payloads” permission" in html


def test_attempts_include_sweep_recoveries_and_operator_actions():
    first = claim("t", "worker-1")
    claimed_at = WorkItem.objects.get(pk=first.work_item_id).lease_acquired_at
    shift(first.work_item_id, lease_expires_at=-5)
    RecoverySweep(scan_interval_seconds=5).scan_and_recover()
    manager = LeaseManager("worker-2")
    WorkItem.objects.filter(pk=first.work_item_id).update(run_after=None)
    second = manager.acquire_lease(task_id_filter="t")
    apply_action("force_release", first.work_item_id, expected_token=second.token,
                 actor="alice", reason="stuck on NFS")  # fmt: skip
    third = LeaseManager("worker-3").acquire_lease(task_id_filter="t")
    LeaseManager("worker-3").release_lease(third.work_item_id, True, token=third.token)

    item = WorkItem.objects.get(pk=first.work_item_id)
    attempts = item_failures(item, include_payloads=True).attempts
    assert [(a.token, a.worker, a.outcome) for a in attempts] == [
        (1, "worker-1", "lease expired: re-queued by the sweep"),
        (2, "worker-2", "force-release by alice: stuck on NFS"),
        (3, None, "completed"),
    ]
    assert attempts[0].error == "Lease expired - retry 1/3"
    assert attempts[0].started_at == claimed_at  # a killed attempt has its start time
    assert attempts[2].started_at == item.lease_acquired_at
    assert attempts[2].ended_at == item.completed_at
    hidden = item_failures(item).attempts
    assert [a.outcome for a in hidden] == [a.outcome for a in attempts]
    assert all(a.error is None for a in hidden)


def test_errors_are_grouped_by_type_and_normalised_message():
    assert normalise("ValueError: id 123 not found in 'eu-1'") == (
        "ValueError",
        "id N not found in '…'",
    )
    assert normalise("Max retries exceeded") == ("", "Max retries exceeded")
    assert normalise("requests.exceptions.ConnectionError: 10.0.0.7:443 refused")[0] == (
        "requests.exceptions.ConnectionError"
    )
    for n in (123, 456, 789):
        failed(f"v{n}", ValueError(f"id {n} not found"), "send_invoice")
    failed("k", KeyError("customer"), "resize")
    old = failed("old", ValueError("id 1 not found"))
    shift(old, completed_at=-3 * 86400)
    groups, truncated = error_groups(database_now() - timedelta(days=1))
    assert not truncated
    assert [(g.exception_type, g.message, g.count) for g in groups] == [
        ("ValueError", "id N not found", 3),
        ("KeyError", "'…'", 1),
    ]
    assert groups[0].work_types == ("send_invoice",)


def test_retry_this_group_with_a_count_a_cap_and_an_audit_record(monkeypatch):
    ids = [failed(f"v{n}", ValueError(f"id {n} not found")) for n in range(3)]
    other = failed("k", KeyError("customer"))
    operator = client_with(*VIEW_ALL, FORCE, PAYLOAD)
    page = operator.get(ERRORS_URL).content.decode()
    retry = re.search(r'<tr data-group="(\w+)"[^>]*>.*?id N not found.*?'
                      r'href="([^"]+)">Retry this group', page, re.S)  # fmt: skip
    confirm = operator.get(retry[2].replace("&amp;", "&"))
    html = confirm.content.decode()
    assert "<strong>3 work items</strong> match now" in html
    listed = html.split('id="leasing-bulk-items"')[1].split("</table>")[0]
    assert all(pk in listed for pk in ids) and other not in listed  # the items it touches
    assert "id 0 not found" in listed  # their raw errors, for a user allowed to read them
    assert all(WorkItem.objects.get(pk=pk).status == "failed" for pk in ids)

    fields = form_fields(html, "leasing-bulk-form")
    fields["reason"] = ["the lookup service is back"]
    done = operator.post(retry[2].replace("&amp;", "&"), fields, follow=True)
    assert any("3 work items sent back to pending" in str(m) for m in done.context["messages"])
    for pk in ids:
        item = WorkItem.objects.get(pk=pk)
        assert (item.status, item.retry_count) == ("pending", 0)
    assert WorkItem.objects.get(pk=other).status == "failed"
    entries = LogEntry.objects.filter(object_id__in=ids)
    # The audit log names the group by its type and key: every viewer reads the log.
    assert entries.count() == 3
    assert all("ValueError (group " in e.change_message for e in entries)
    assert not any("not found" in e.change_message for e in entries)
    assert Checkpoint.objects.filter(checkpoint_type="state_transition").count() == 3

    # A group over the cap is refused; an unknown group is reported; nothing changes.
    more = [failed(f"w{n}", ValueError(f"id {n} not found")) for n in range(2)]
    monkeypatch.setattr("leasing.admin.bulk.BULK_LIMIT", 1)
    html = operator.get(retry[2].replace("&amp;", "&")).content.decode()
    assert "More than 1 work items match" in html and "leasing-bulk-form" not in html
    gone = operator.get(f"{ERRORS_URL}retry/?key=0123456789abcdef&window=1440", follow=True)
    assert any("has this error any more" in str(m) for m in gone.context["messages"])
    assert operator.get(f"{ERRORS_URL}retry/?key=%00&window=%00", follow=True).status_code == 200
    assert all(WorkItem.objects.get(pk=pk).status == "failed" for pk in more)


def test_viewers_see_top_errors_without_error_text_or_a_retry_button():
    failed("v", ValueError("boom"))
    viewer = client_with(*VIEW_ALL)
    html = viewer.get(ERRORS_URL).content.decode()
    assert "boom" not in html and "ValueError" in html and "Retry this group" not in html
    assert "Error text hidden" in html
    assert viewer.get(f"{ERRORS_URL}retry/?key=0123456789abcdef").status_code == 403
