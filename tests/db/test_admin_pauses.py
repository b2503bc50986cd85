"""Pausing and resuming from the admin: the dashboard's buttons, the confirmation, bad input."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

import leasing
from leasing import enqueue_many
from leasing.models import Pause
from tests.support.admin import FORCE, VIEW_ALL, dashboard_url, make_user

pytestmark = pytest.mark.django_db

PAUSES = "/admin/leasing/workitem/pauses/"


@pytest.fixture
def operator() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(make_user("operator", *VIEW_ALL, FORCE))
    return client


@pytest.fixture
def viewer() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(make_user("viewer", *VIEW_ALL))
    return client


def test_the_url_is_the_pauses_page():
    assert reverse("admin:leasing_workitem_pauses") == PAUSES


def test_the_dashboard_shows_pause_buttons_paused_state_and_limit_usage(operator, leasing_settings):
    leasing_settings(QUEUE_LIMITS={"emails": 3}, WORK_TYPE_LIMITS={"test.echo": 2})
    enqueue_many(
        [{"task_id": f"t{i}", "work_type": "test.echo", "queue_name": "emails"} for i in range(4)]
    )
    leasing.LeaseManager("w").acquire_leases(4)  # two in flight: the type's limit
    html = operator.get(dashboard_url()).content.decode()
    assert "queue 2 / 3 in flight" in html and "type 2 / 2 in flight" in html
    assert 'data-action="pause-queue"' in html and 'data-paused="no"' in html
    leasing.pause(queue="emails", by="ops", reason="outage")
    html = operator.get(dashboard_url()).content.decode()
    assert "queue paused" in html and 'data-action="resume-queue"' in html
    assert 'data-paused="yes"' in html


def test_pausing_from_the_dashboard_confirms_then_records_who_and_why(operator):
    page = operator.get(
        PAUSES, {"action": "pause", "kind": "queue", "name": "emails", "next": dashboard_url()}
    )
    assert page.status_code == 200
    html = page.content.decode()
    assert "Pause the queue “emails”?" in html and "csrfmiddlewaretoken" in html
    assert Pause.objects.count() == 0  # a GET changes nothing
    response = operator.post(
        PAUSES,
        {
            "action": "pause",
            "kind": "queue",
            "name": "emails",
            "reason": "provider outage",
            "next": dashboard_url(),
        },
    )
    assert response.status_code == 302 and response.url == dashboard_url()
    pause = Pause.objects.get()
    assert (pause.kind, pause.name, pause.paused_by, pause.reason) == (
        "queue",
        "emails",
        "operator",
        "provider outage",
    )
    assert LogEntry.objects.get().change_message == "Paused queue emails: provider outage"
    listing = operator.get(PAUSES).content.decode()
    assert "provider outage" in listing and 'data-name="emails"' in listing
    response = operator.post(
        PAUSES, {"action": "resume", "kind": "queue", "name": "emails", "reason": "back"}
    )
    assert response.status_code == 302
    pause.refresh_from_db()
    assert pause.resumed_by == "operator" and pause.resume_reason == "back"
    assert LogEntry.objects.count() == 2


@pytest.mark.parametrize(
    "data",
    [
        {"action": "pause", "kind": "queue", "name": "q", "reason": ""},
        {"action": "pause", "kind": "queue", "name": "", "reason": "r"},
        {"action": "pause", "kind": "bogus", "name": "q", "reason": "r"},
        {"action": "explode", "kind": "queue", "name": "q", "reason": "r"},
        {"action": "pause", "kind": "queue", "name": "x" * 300, "reason": "r"},
        {"action": "pause", "kind": "queue", "name": "   ", "reason": "r"},
        {"action": "pause", "kind": "queue", "name": "q\x00", "reason": "r"},
        {"action": "pause", "kind": "queue", "name": "q", "reason": "r" * 2000},
        {},
    ],
)
def test_bad_posts_answer_with_a_message_and_change_nothing(operator, data):
    response = operator.post(PAUSES, data, follow=True)
    assert response.status_code == 200
    html = response.content.decode()
    assert (
        "errorlist" in html or 'class="errornote"' in html or "nothing was changed" in html.lower()
    )
    assert Pause.objects.count() == 0 and LogEntry.objects.count() == 0


@pytest.mark.parametrize(
    "query",
    [
        {"action": "pause", "kind": "bogus", "name": "q"},
        {"action": "pause", "kind": "queue", "name": ""},
        {"action": "pause", "kind": "queue", "name": "q\x00"},
        {"action": "pause", "kind": "queue"},
    ],
)
def test_a_bad_confirmation_link_is_a_message_not_a_500(operator, query):
    response = operator.get(PAUSES, query, follow=True)
    assert response.status_code == 200
    assert "nothing was changed" in response.content.decode().lower()
    assert Pause.objects.count() == 0


def test_without_the_operator_permission_nothing_can_be_paused(viewer):
    assert viewer.get(PAUSES).status_code == 200
    assert viewer.get(PAUSES, {"action": "pause", "kind": "queue", "name": "q"}).status_code == 403
    response = viewer.post(PAUSES, {"action": "pause", "kind": "queue", "name": "q", "reason": "r"})
    assert response.status_code == 403 and Pause.objects.count() == 0
    assert 'data-action="pause-queue"' not in viewer.get(dashboard_url()).content.decode()


def test_a_post_without_csrf_is_refused(operator):
    strict = Client(enforce_csrf_checks=True, raise_request_exception=False)
    strict.force_login(make_user("strict", *VIEW_ALL, FORCE))
    response = strict.post(PAUSES, {"action": "pause", "kind": "queue", "name": "q", "reason": "r"})
    assert response.status_code == 403 and Pause.objects.count() == 0


def test_an_offsite_next_is_ignored(operator):
    response = operator.post(
        PAUSES,
        {
            "action": "pause",
            "kind": "queue",
            "name": "q",
            "reason": "r",
            "next": "https://evil.example/",
        },
    )
    assert response.status_code == 302 and response.url == PAUSES
