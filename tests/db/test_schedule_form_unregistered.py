"""The schedule change form and a work type whose handler went away (SQLite and
PostgreSQL): the stored work type is kept, so the schedule can still be switched off
or edited; a new or changed work type must have a handler."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from leasing.models import Schedule
from leasing.services import schedules as service
from leasing.ticks import parse_schedule
from tests.support.admin import make_user, messages_of

pytestmark = pytest.mark.django_db

GONE = "gone.type"  # never registered: stands for a handler removed since the schedule was made


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(make_user("root", superuser=True))
    return client


@pytest.fixture
def orphan(leasing_settings) -> int:
    """An enabled admin schedule of a work type that has no handler (any more)."""
    pk = service.save_schedule(parse_schedule("orphan", {"work_type": GONE, "every": 3600}))
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    return pk


def change(client: Client, pk: int, **overrides: str | None):
    data = {
        "name": "orphan",
        "work_type": GONE,
        "cron": "",
        "every": "3600",
        "timezone": "UTC",
        "payload": "{}",
        "queue_name": "default",
        "missed": "skip",
        "enabled": "on",
        **overrides,
    }
    url = reverse("admin:leasing_schedule_change", args=[pk])
    return client.post(url, {k: v for k, v in data.items() if v is not None}, follow=True)


def errors_of(response) -> dict:
    form = response.context.get("adminform")
    return dict(form.form.errors) if form is not None else {}


def test_a_schedule_whose_handler_went_away_can_be_switched_off_through_its_form(
    admin_client, orphan
):
    response = change(admin_client, orphan, enabled=None)  # the box unticked
    assert errors_of(response) == {}
    assert any("was changed successfully" in m for m in messages_of(response))
    assert not any("no handler is registered" in m for m in messages_of(response))
    row = Schedule.objects.get(pk=orphan)
    assert (row.enabled, row.work_type) == (False, GONE)


def test_editing_it_while_it_stays_enabled_is_saved_with_a_warning(admin_client, orphan):
    response = change(admin_client, orphan, payload='{"to": "ops"}')
    assert errors_of(response) == {}
    text = messages_of(response)
    assert any(
        "is enabled, but no handler is registered for its work type 'gone.type'" in m for m in text
    ), text
    row = Schedule.objects.get(pk=orphan)
    assert (row.enabled, row.payload) == (True, {"to": "ops"})


def test_changing_it_to_another_unregistered_work_type_is_still_refused(admin_client, orphan):
    response = change(admin_client, orphan, work_type="other.gone", enabled=None)
    assert "No handler is registered" in " ".join(errors_of(response)["work_type"])
    row = Schedule.objects.get(pk=orphan)
    assert (row.enabled, row.work_type) == (True, GONE)


def test_a_new_schedule_of_the_removed_work_type_is_still_refused(admin_client, orphan):
    response = change(admin_client, orphan)  # sanity: the stored one saves
    assert errors_of(response) == {}
    data = {
        "name": "another",
        "work_type": GONE,
        "every": "60",
        "timezone": "UTC",
        "payload": "{}",
        "queue_name": "default",
        "missed": "skip",
        "enabled": "on",
    }
    response = admin_client.post(reverse("admin:leasing_schedule_add"), data)
    assert "No handler is registered" in " ".join(errors_of(response)["work_type"])
    assert list(Schedule.objects.values_list("name", flat=True)) == ["orphan"]


def test_the_enable_action_warns_of_a_schedule_whose_handler_went_away(admin_client, orphan):
    Schedule.objects.filter(pk=orphan).update(enabled=False)
    url = reverse("admin:leasing_schedule_changelist")
    response = admin_client.post(
        url, {"action": "enable_selected", "_selected_action": [str(orphan)]}, follow=True
    )
    assert response.status_code == 200
    texts = [str(m) for m in response.context["messages"]]
    assert "1 schedule(s) enabled." in texts
    assert any("No handler is registered for the work type of 'orphan'" in t for t in texts)
    assert Schedule.objects.get(pk=orphan).enabled
