"""A schedule remembers why the scheduler could not enqueue its tick (`last_error`,
since `last_error_at`), and the admin shows it: recorded by the pass that failed,
without moving the tick or holding back the other schedules, and forgotten once a
tick is enqueued or the schedule is edited or switched on again."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from leasing.admin.display import ERROR_HIDDEN
from leasing.exceptions import InvalidInput
from leasing.models import Schedule, WorkItem
from leasing.services import schedules as service
from leasing.ticks import parse_schedule
from tests.support.admin import make_user

pytestmark = pytest.mark.django_db

LIST = reverse("admin:leasing_schedule_changelist")
NO_HANDLER = "No handler is registered for work type"


def spec(name="beat", **definition):
    return parse_schedule(name, {"work_type": "test.noop", "every": 60, **definition})


def overdue(*names: str) -> None:
    """Make these schedules due by the database clock (which the list also reads)."""
    Schedule.objects.filter(name__in=names).update(next_run_at=Now() - timedelta(seconds=40))


def row_of(html: str, pk: int) -> str:
    start = html.index(f'name="_selected_action" value="{pk}"')
    return html[start : html.index("</tr>", start)]


def root() -> Client:
    client = Client()
    client.force_login(make_user("root", superuser=True))
    return client


def test_a_refused_tick_is_recorded_shown_escaped_and_cleared_by_the_next_enqueued_one(
    leasing_settings,
):
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    # Saved while its handler existed (the service does not ask); the name quotes HTML.
    lost = service.save_schedule(spec("lost", work_type="gone.<b>type</b>"))
    beat = service.save_schedule(spec("beat"))
    overdue("lost", "beat")
    owed = Schedule.objects.get(pk=lost).next_run_at
    # The failing schedule comes first in the pass's order; the other is enqueued all the same.
    assert [f.schedule for f in service.run_due()] == ["beat"]
    row = Schedule.objects.get(pk=lost)
    assert row.last_error is not None and f"{NO_HANDLER} 'gone.<b>type</b>'" in row.last_error
    assert row.last_error_at is not None
    assert row.next_run_at == owed  # the tick is still owed: not advanced
    assert Schedule.objects.get(pk=beat).last_error is None

    client = root()
    html = client.get(LIST).content.decode()
    shown = row_of(html, lost)
    assert f"{NO_HANDLER} &#x27;gone.&lt;b&gt;type&lt;/b&gt;&#x27;" in shown  # escaped
    assert "<b>type</b>" not in shown
    assert "since" in shown and "overdue by" in shown
    # The recorded failure says why: the registry's guess is not said a second time.
    assert "so the scheduler cannot enqueue its ticks" not in shown
    assert NO_HANDLER not in row_of(html, beat)
    change = client.get(reverse("admin:leasing_schedule_change", args=[lost])).content.decode()
    assert "Last failure" in change
    assert f"{NO_HANDLER} &#x27;gone.&lt;b&gt;type&lt;/b&gt;&#x27;" in change

    leasing_settings(ALLOW_UNREGISTERED_TYPES=True)  # the handler is back
    assert [f.schedule for f in service.run_due()] == ["lost"]
    row = Schedule.objects.get(pk=lost)
    assert (row.last_error, row.last_error_at) == (None, None)
    assert NO_HANDLER not in row_of(client.get(LIST).content.decode(), lost)


def test_the_real_reason_is_recorded_not_the_admins_guess(leasing_settings):
    # The admin's registry has the handler; the scheduler refuses the payload.
    pk = service.save_schedule(spec("big", payload={"blob": "x" * 200}))
    overdue("big")
    leasing_settings(MAX_PAYLOAD_BYTES=100)
    assert service.run_due() == []
    error = Schedule.objects.get(pk=pk).last_error
    assert error is not None and "over the limit of 100 bytes" in error
    assert "MAX_PAYLOAD_BYTES" in row_of(root().get(LIST).content.decode(), pk)


def test_the_same_failure_keeps_its_time_and_a_new_one_replaces_it(leasing_settings):
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    pk = service.save_schedule(spec("lost", work_type="gone.type", payload={"blob": "x" * 200}))
    overdue("lost")
    service.run_due()
    first = Schedule.objects.get(pk=pk)
    assert first.last_error is not None and NO_HANDLER in first.last_error
    long_ago = datetime(2026, 1, 1, tzinfo=UTC)
    Schedule.objects.filter(pk=pk).update(last_error_at=long_ago)
    service.run_due()  # the same failure again: "since" stays when it was first hit
    assert Schedule.objects.get(pk=pk).last_error_at == long_ago
    leasing_settings(ALLOW_UNREGISTERED_TYPES=True, MAX_PAYLOAD_BYTES=100)
    service.run_due()  # another reason: recorded, with its own time
    row = Schedule.objects.get(pk=pk)
    assert row.last_error is not None and "over the limit of 100 bytes" in row.last_error
    assert row.last_error_at is not None and row.last_error_at > long_ago


def test_the_recorded_text_is_one_bounded_line(leasing_settings, monkeypatch):
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    long = service.save_schedule(spec("long", work_type="gone." + "t" * 240))
    overdue("long")
    service.run_due()
    error = Schedule.objects.get(pk=long).last_error
    assert error is not None and NO_HANDLER in error
    assert len(error) == service.ERROR_CHARS and error.endswith("...")

    def broken(*args, **kwargs):
        raise RuntimeError("the first line\nand a second one")

    leasing_settings(ALLOW_UNREGISTERED_TYPES=True)
    monkeypatch.setattr(service, "enqueue", broken)
    service.run_due()
    assert Schedule.objects.get(pk=long).last_error == "RuntimeError: the first line"


def test_a_failure_that_cannot_be_recorded_is_logged_and_the_pass_goes_on(
    leasing_settings, monkeypatch, caplog
):
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    service.save_schedule(spec("lost", work_type="gone.type"))
    service.save_schedule(spec("beat"))
    overdue("lost", "beat")
    monkeypatch.setattr(
        service.sql, "record_failure", lambda *args: ("UPDATE no_such_table SET x = 1", [])
    )
    with caplog.at_level(logging.WARNING, logger="leasing.schedules"):
        assert [f.schedule for f in service.run_due()] == ["beat"]
    assert "schedule lost: could not record why its tick failed" in caplog.text
    assert WorkItem.objects.count() == 1
    assert not Schedule.objects.exclude(last_error=None).exists()


def test_a_failure_is_not_recorded_over_a_row_edited_with_a_new_start(monkeypatch):
    # The pass read the row; the operator's edit (a new timing) commits before the
    # pass fails on the row as it read it: the edit's clean slate stays.
    pk = service.save_schedule(spec("digest"))
    overdue("digest")
    real_parse_timing = service.parse_timing

    def edit_then_fail(*args):
        service.save_schedule(spec("digest", every=120), pk=pk, retime=True)
        monkeypatch.setattr(service, "parse_timing", real_parse_timing)
        raise InvalidInput("unknown time zone 'Mars/Olympus'")

    monkeypatch.setattr(service, "parse_timing", edit_then_fail)
    assert service.run_due() == []
    assert Schedule.objects.get(pk=pk).last_error is None


def test_an_admin_edit_or_switching_on_again_forgets_the_failure(leasing_settings):
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    edited = service.save_schedule(spec("edited", work_type="gone.type"))
    switched = service.save_schedule(spec("switched", work_type="gone.type"))
    synced = "synced"
    service.sync_from_settings([spec(synced, work_type="gone.type")])
    overdue("edited", "switched", synced)
    assert service.run_due() == []
    assert not Schedule.objects.filter(last_error=None).exists()

    # The change form, work type kept (its handler still gone), payload edited.
    client = root()
    response = client.post(
        reverse("admin:leasing_schedule_change", args=[edited]),
        {
            "name": "edited",
            "work_type": "gone.type",
            "cron": "",
            "every": "60",
            "timezone": "UTC",
            "payload": '{"v": 2}',
            "queue_name": "default",
            "missed": "skip",
            "enabled": "on",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    row = Schedule.objects.get(pk=edited)
    assert (row.payload, row.last_error, row.last_error_at) == ({"v": 2}, None, None)

    # Switched off, it owes nothing and shows nothing; switched on, it starts afresh.
    service.set_enabled([switched], False)
    assert Schedule.objects.get(pk=switched).last_error is not None
    assert NO_HANDLER not in row_of(client.get(LIST).content.decode(), switched)
    client.post(LIST, {"action": "enable_selected", "_selected_action": [str(switched)]})
    assert Schedule.objects.get(pk=switched, enabled=True).last_error is None

    # A settings schedule whose definition changed is rewritten from a clean slate.
    service.sync_from_settings([spec(synced, work_type="test.noop")])
    assert Schedule.objects.get(name=synced).last_error is None


def test_only_payload_readers_see_the_error_text(leasing_settings):
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    pk = service.save_schedule(spec("lost", work_type="gone.secret-type"))
    overdue("lost")
    service.run_due()
    viewer = Client()
    viewer.force_login(make_user("viewer", "leasing.view_schedule", "leasing.change_schedule"))
    shown = row_of(viewer.get(LIST).content.decode(), pk)
    assert ERROR_HIDDEN.split(":")[0] in shown and "since" in shown
    assert NO_HANDLER not in shown
    reader = Client()
    reader.force_login(make_user("reader", "leasing.change_schedule", "leasing.view_payload"))
    assert NO_HANDLER in row_of(reader.get(LIST).content.decode(), pk)
