"""Retrying items and the one rule for error text (issue 42, points 2 and 3)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from leasing import LeaseManager
from leasing.models import WorkItem
from tests.support.admin import (
    FORCE,
    PAYLOAD,
    VIEW_ALL,
    change_url,
    changelist_url,
    claim,
    dashboard_url,
    make_user,
)

pytestmark = pytest.mark.django_db

ERRORS_URL = "/admin/leasing/workitem/errors/"
SECRET_ACCOUNT = "initech-7731"


def client_with(*perms: str) -> Client:
    client = Client()
    client.force_login(make_user(f"u{len(perms)}-{'-'.join(p[-6:] for p in perms)}", *perms))
    return client


def fail_once(task_id: str, error: str, *, retry: bool, max_retries: int = 6) -> str:
    """An item whose attempt failed with `error`: retrying (pending) or failed for good."""
    lease = claim(task_id, "w-1", work_type="billing.sync", max_retries=max_retries)
    LeaseManager("w-1").release_lease(
        lease.work_item_id, False, error=error, retry=retry, token=lease.token
    )
    return lease.work_item_id


def test_retrying_items_have_a_filter_a_tile_and_count_as_failed_attempts():
    retrying = [fail_once(f"r{i}", f"KeyError: 'acct-{i}'", retry=True) for i in range(3)]
    final = fail_once("f", "KeyError: 'acct-9'", retry=False, max_retries=0)
    assert {WorkItem.objects.get(pk=pk).status for pk in retrying} == {"pending"}
    viewer = client_with(*VIEW_ALL)
    page = viewer.get(changelist_url("retrying=yes"))
    assert page.context["cl"].result_count == 3
    assert final not in page.content.decode()
    assert viewer.get(changelist_url("retrying=maybe")).status_code == 302  # refused, not a 500

    html = viewer.get(dashboard_url()).content.decode()
    tile = re.search(r'Retrying.*?leasing-tile-value">([^<]+)<', html, re.S)
    assert tile and tile.group(1) == "3"
    row = html.split('data-work-type="billing.sync"')[1].split("</tr>")[0]
    assert 'data-retrying="3"' in row
    assert 'data-failed-attempts="4"' in row  # three retried attempts and one final
    assert "100.0 %" in row  # every attempt that ended failed


def test_top_errors_show_retrying_failures_with_a_final_only_toggle_and_raw_messages():
    for i in range(2):
        fail_once(f"r{i}", f"KeyError: 'acct-{i}'", retry=True)
    fail_once("f", "KeyError: 'acct-9'", retry=False, max_retries=0)
    reader = client_with(*VIEW_ALL, PAYLOAD)
    html = reader.get(ERRORS_URL).content.decode()
    group = re.search(r'<tr data-group="\w+" data-failed="(\d+)" data-retrying="(\d+)"', html)
    assert group and group.groups() == ("1", "2")
    # The two keys that failed are told apart for a user allowed to read them.
    assert "KeyError: &#x27;acct-0&#x27;" in html and "KeyError: &#x27;acct-9&#x27;" in html
    assert "3 distinct messages" in html
    final = reader.get(f"{ERRORS_URL}?final=1").content.decode()
    group = re.search(r'<tr data-group="\w+" data-failed="(\d+)" data-retrying="(\d+)"', final)
    assert group and group.groups() == ("1", "0")
    assert 'data-final-only="yes"' in final


def test_a_group_of_retrying_items_only_offers_no_retry_button():
    fail_once("r", "TimeoutError: slow", retry=True)
    html = client_with(*VIEW_ALL, FORCE).get(ERRORS_URL).content.decode()
    assert "retrying on its own" in html and "Retry this group" not in html


def test_error_text_follows_the_payload_permission_on_every_page():
    failed = fail_once("p", f"PermanentError: account {SECRET_ACCOUNT} does not exist",
                       retry=False, max_retries=0)  # fmt: skip
    retrying = fail_once("q", f"PermanentError: account {SECRET_ACCOUNT} is locked", retry=True)
    viewer = client_with(*VIEW_ALL, FORCE)  # may act, may not read payloads or errors
    reader = client_with(*VIEW_ALL, FORCE, PAYLOAD)
    pages = [
        change_url(failed),
        change_url(retrying),
        changelist_url(),
        changelist_url("retrying=yes"),
        changelist_url("status__exact=failed"),
        dashboard_url(),
        ERRORS_URL,
        f"{ERRORS_URL}?final=1",
        "/admin/leasing/workitem/history/",
        "/admin/leasing/workitem/timeline/p/",
        f"/admin/leasing/workitem/{failed}/history/",
        "/admin/leasing/checkpoint/",
        "/admin/leasing/worker/",
    ]
    html = reader.get(ERRORS_URL).content.decode()
    retry_url = re.search(r'href="([^"]*errors/retry/\?[^"]*)"', html)
    assert retry_url
    for url in pages:
        response = viewer.get(url)
        assert response.status_code == 200, url
        assert SECRET_ACCOUNT not in response.content.decode(), url
    fragment = viewer.get(dashboard_url(), HTTP_X_LEASING_FRAGMENT="1")  # the live refresh
    assert fragment.status_code == 200 and SECRET_ACCOUNT not in fragment.content.decode()
    confirm = viewer.get(retry_url.group(1).replace("&amp;", "&")).content.decode()
    assert failed in confirm and SECRET_ACCOUNT not in confirm  # the item, not its error
    item_page = viewer.get(change_url(failed)).content.decode()
    assert "Error text hidden" in item_page
    assert SECRET_ACCOUNT in reader.get(change_url(failed)).content.decode()
    assert SECRET_ACCOUNT in reader.get(retry_url.group(1).replace("&amp;", "&")).content.decode()
