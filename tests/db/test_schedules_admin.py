"""The Schedules admin: the list, adding and editing with validation of the cron
expression, time zone and payload (field errors, never a 500), settings schedules
read-only except enabled, and the enable/disable actions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from leasing.models import Schedule
from leasing.services import schedules as service
from leasing.ticks import parse_schedule
from tests.support.admin import make_user

pytestmark = pytest.mark.django_db

ADD = reverse("admin:leasing_schedule_add")
LIST = reverse("admin:leasing_schedule_changelist")


def change_url(pk: int) -> str:
    return reverse("admin:leasing_schedule_change", args=[pk])


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(make_user("root", superuser=True))
    return client


def form(**overrides):
    data = {
        "name": "digest",
        "work_type": "test.noop",
        "cron": "0 3 * * *",
        "every": "",
        "timezone": "Europe/Paris",
        "payload": '{"to": "ops"}',
        "queue_name": "default",
        "missed": "skip",
        "enabled": "on",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def test_adding_a_schedule_through_the_form(admin_client):
    response = admin_client.post(ADD, form())
    assert response.status_code == 302, response.content.decode()[:2000]
    row = Schedule.objects.get()
    assert (row.name, row.cron, row.timezone, row.payload) == (
        "digest",
        "0 3 * * *",
        "Europe/Paris",
        {"to": "ops"},
    )
    assert not row.from_settings and row.enabled
    assert row.next_run_at is not None and row.next_run_at.astimezone(UTC).hour in (1, 2)


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"cron": "0 27 * * *"}, "cron", "invalid cron expression"),
        ({"cron": "every night"}, "cron", "must have 5 fields"),
        ({"timezone": "Europe/Atlantis"}, "timezone", "unknown time zone"),
        ({"timezone": "../../etc/passwd"}, "timezone", "unknown time zone"),
        ({"every": "60"}, None, "either a cron expression or an interval"),
        ({"cron": ""}, None, "either a cron expression or an interval"),
        ({"cron": "", "every": "0"}, "every", "positive whole number"),
        ({"payload": "[1, 2]"}, "payload", "JSON object"),
        ({"payload": "{bad json"}, "payload", "valid JSON"),
        ({"payload": '{"_schedule": 1}'}, "payload", "_schedule"),
        ({"payload": '{"a": "\\u0000"}'}, "payload", "NUL"),
        ({"missed": "later"}, "missed", "valid choice"),
        ({"name": "nul\x00name"}, "name", "Null characters"),
        ({"cron": "0 3 * * \x00"}, "cron", "Null characters"),
    ],
)
def test_bad_input_is_a_field_error_and_writes_nothing(admin_client, overrides, field, words):
    response = admin_client.post(ADD, form(**overrides))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    key = field or "__all__"
    assert key in errors, errors
    assert words in " ".join(errors[key])
    assert not Schedule.objects.exists()


def test_an_unregistered_work_type_is_refused(admin_client, leasing_settings):
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    response = admin_client.post(ADD, form(work_type="no.such.type"))
    assert response.status_code == 200
    assert "No handler is registered" in " ".join(
        response.context["adminform"].form.errors["work_type"]
    )


def test_a_duplicate_name_is_a_field_error(admin_client):
    service.save_schedule(parse_schedule("digest", {"work_type": "test.noop", "every": 60}))
    response = admin_client.post(ADD, form())
    assert response.status_code == 200
    assert "already exists" in " ".join(response.context["adminform"].form.errors["name"])


def test_editing_the_payload_keeps_the_next_tick_and_editing_the_timing_moves_it(admin_client):
    admin_client.post(ADD, form(cron="", every="3600"))
    row = Schedule.objects.get()
    Schedule.objects.filter(pk=row.pk).update(next_run_at=datetime(2030, 1, 1, tzinfo=UTC))
    response = admin_client.post(change_url(row.pk), form(cron="", every="3600", payload='{"a":1}'))
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.payload == {"a": 1} and row.next_run_at == datetime(2030, 1, 1, tzinfo=UTC)
    admin_client.post(change_url(row.pk), form(cron="", every="60", payload='{"a":1}'))
    row.refresh_from_db()
    assert row.every == 60 and row.next_run_at < datetime(2030, 1, 1, tzinfo=UTC)


def test_a_settings_schedule_is_read_only_except_enabled(admin_client):
    service.sync_from_settings([parse_schedule("nightly", {"work_type": "test.noop", "every": 60})])
    row = Schedule.objects.get()
    page = admin_client.get(change_url(row.pk))
    assert page.status_code == 200
    assert list(page.context["adminform"].form.fields) == ["enabled"]
    assert "LEASING[&#x27;SCHEDULES&#x27;]" in page.content.decode()
    # Posting other fields changes nothing but what the form has: enabled.
    response = admin_client.post(change_url(row.pk), {"every": "5", "work_type": "evil"})
    assert response.status_code == 302
    row.refresh_from_db()
    assert (row.every, row.work_type, row.enabled) == (60, "test.noop", False)
    admin_client.post(change_url(row.pk), {"enabled": "on"})
    row.refresh_from_db()
    assert row.enabled
    delete = admin_client.get(reverse("admin:leasing_schedule_delete", args=[row.pk]))
    assert delete.status_code == 403


def test_the_list_and_the_enable_disable_actions(admin_client):
    a = service.save_schedule(parse_schedule("a", {"work_type": "test.noop", "every": 60}))
    b = service.save_schedule(parse_schedule("b", {"work_type": "test.noop", "cron": "0 3 * * *"}))
    Schedule.objects.filter(pk=a).update(last_work_item_id="01HZZZZZZZZZZZZZZZZZZZZZZZ")
    page = admin_client.get(LIST)
    assert page.status_code == 200
    html = page.content.decode()
    for text in ("every 60s", "0 3 * * *", "01HZZZZZZZZZZZZZZZZZZZZZZZ", "admin"):
        assert text in html
    assert reverse("admin:leasing_workitem_change", args=["01HZZZZZZZZZZZZZZZZZZZZZZZ"]) in html
    response = admin_client.post(
        LIST, {"action": "disable_selected", "_selected_action": [str(a), str(b)]}
    )
    assert response.status_code == 302
    assert not Schedule.objects.filter(enabled=True).exists()
    admin_client.post(LIST, {"action": "enable_selected", "_selected_action": [str(a)]})
    assert list(Schedule.objects.filter(enabled=True).values_list("pk", flat=True)) == [a]


def every(name: str, seconds: int) -> int:
    return service.save_schedule(parse_schedule(name, {"work_type": "test.noop", "every": seconds}))


def list_row(html: str, pk: int) -> str:
    """The list's row of schedule `pk`, from its checkbox on."""
    start = html.index(f'name="_selected_action" value="{pk}"')
    return html[start : html.index("</tr>", start)]


def test_a_next_run_past_by_more_than_three_scheduler_passes_is_marked_overdue(admin_client):
    dead = every("dead-scheduler", 5)
    late = every("one-pass-late", 5)
    off = every("switched-off", 5)
    # Against the database clock, as the scheduler reads it (in the test's
    # transaction, now() stands still: the ages are exact).
    Schedule.objects.filter(pk=dead).update(next_run_at=Now() - timedelta(seconds=40))
    Schedule.objects.filter(pk=late).update(next_run_at=Now() - timedelta(seconds=2))
    Schedule.objects.filter(pk=off).update(enabled=False, next_run_at=Now() - timedelta(seconds=40))
    html = admin_client.get(LIST).content.decode()
    assert "overdue by 40 s" in list_row(html, dead)
    assert 'class="leasing-bad-text leasing-overdue"' in list_row(html, dead)
    assert "overdue" not in list_row(html, late)  # a pass may still be on its way
    assert "overdue" not in list_row(html, off)  # disabled: no tick is owed
    page = admin_client.get(change_url(dead)).content.decode()
    assert "overdue by 40 s" in page


def test_schedule_times_are_shown_to_the_second_in_the_sites_time_zone(admin_client, settings):
    settings.TIME_ZONE = "Europe/Paris"
    pk = every("future", 60)
    Schedule.objects.filter(pk=pk).update(
        next_run_at=datetime(2099, 1, 1, 12, 34, 56, tzinfo=UTC),
        last_tick_at=datetime(2025, 1, 1, 12, 34, 7, tzinfo=UTC),
        last_run_at=datetime(2025, 1, 1, 12, 34, 8, tzinfo=UTC),
    )
    row = list_row(admin_client.get(LIST).content.decode(), pk)
    assert "2099-01-01 13:34:56" in row and "2025-01-01 13:34:08" in row
    assert "overdue" not in row
    page = admin_client.get(change_url(pk)).content.decode()
    for shown in ("2099-01-01 13:34:56", "2025-01-01 13:34:07", "2025-01-01 13:34:08"):
        assert shown in page
    assert "overdue" not in page


def test_deleting_admin_schedules_but_never_settings_ones(admin_client):
    service.sync_from_settings([parse_schedule("s", {"work_type": "test.noop", "every": 60})])
    a = service.save_schedule(parse_schedule("a", {"work_type": "test.noop", "every": 60}))
    s = Schedule.objects.get(name="s").pk

    def delete(*pks: int):
        selected = [str(pk) for pk in pks]
        data = {"action": "delete_selected", "_selected_action": selected, "post": "yes"}
        return admin_client.post(LIST, data)

    assert delete(a, s).status_code == 403  # a settings schedule in the selection: refused
    assert Schedule.objects.count() == 2
    assert delete(a).status_code == 302
    assert list(Schedule.objects.values_list("name", flat=True)) == ["s"]


def test_garbage_in_urls_searches_and_filters_is_never_a_500(admin_client):
    assert admin_client.get(change_url(1).replace("/1/", "/abc/")).status_code in (302, 404)
    assert admin_client.get(LIST + "?enabled__exact=maybe").status_code in (200, 302)
    refused = admin_client.get(LIST, {"q": "nightly\x00"})
    assert refused.status_code == 302 and refused.url == LIST
    response = admin_client.post(
        LIST, {"action": "disable_selected", "_selected_action": ["1\x00"]}, follow=True
    )
    assert response.status_code == 200
    assert "cannot store" in response.content.decode()
