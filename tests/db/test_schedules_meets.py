"""Schedules where they meet the engine's other features: pauses, limits and failed
items of earlier ticks, admin edits made while a pass runs, schedules that keep
failing beside good ones, cron ticks in the hour a daylight-saving change
repeats, and switching on a schedule whose timing this host cannot read. Each
tick enqueues one item, as the schedule says when it enqueues, and the console
says what the database holds."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from leasing import pause, resume
from leasing.models import Schedule, WorkItem
from leasing.services import schedules as service
from leasing.services.schedules import unique_key
from leasing.testing import NotClaimable, run_item
from leasing.ticks import parse_schedule
from tests.support.admin import make_user

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, 0, 0, 0, 400_000, tzinfo=UTC)
TICK = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)


def spec(name="beat", **definition):
    return parse_schedule(name, {"work_type": "test.noop", "every": 60, **definition})


def admin_schedule(name="digest", **definition) -> int:
    """An admin schedule whose next tick is TICK."""
    pk = service.save_schedule(spec(name, **definition))
    Schedule.objects.filter(pk=pk).update(next_run_at=TICK)
    return pk


def test_a_paused_limited_queue_still_gets_one_item_per_tick_whatever_the_last_one_became(
    leasing_settings,
):
    # A pause and a concurrency limit hold claims back, never the schedule's enqueues;
    # each tick has its own unique key, so an earlier tick's item still pending, or
    # failed, neither blocks the next tick nor stands in for it.
    leasing_settings(WORK_TYPE_LIMITS={"test.permanent": 1}, QUEUE_LIMITS={"reports": 1})
    service.sync_from_settings([spec(work_type="test.permanent", queue="reports")], now=T0)
    pause(queue="reports", by="ops", reason="maintenance")
    first = service.run_due(now=T0 + timedelta(seconds=61))
    with pytest.raises(NotClaimable, match="paused"):
        run_item(first[0].work_item_id)
    second = service.run_due(now=T0 + timedelta(seconds=121))  # the first item still pending
    resume(queue="reports", by="ops", reason="done")
    run_item(second[0].work_item_id, raise_errors=False)  # fails for good (PermanentError)
    assert WorkItem.objects.get(pk=second[0].work_item_id).status == "failed"
    third = service.run_due(now=T0 + timedelta(seconds=181))
    fired = first + second + third
    assert [(f.tick, f.ticks, f.duplicate) for f in fired] == [
        (T0.replace(microsecond=0) + timedelta(minutes=n), 1, False) for n in (1, 2, 3)
    ]
    assert WorkItem.objects.count() == 3
    assert dict(WorkItem.objects.values_list("work_item_id", "status")) == {
        first[0].work_item_id: "pending",
        second[0].work_item_id: "failed",
        third[0].work_item_id: "pending",
    }
    # The console: a scheduler that is back (at the database clock) enqueues one item
    # for the ticks it missed, and the list shows it as the last item, not overdue.
    [latest] = service.run_due()
    assert latest.ticks > 1 and WorkItem.objects.count() == 4
    client = Client()
    client.force_login(make_user("root", superuser=True))
    html = client.get(reverse("admin:leasing_schedule_changelist")).content.decode()
    assert latest.work_item_id in html and "overdue" not in html


@pytest.mark.parametrize("edit", ["rename_and_change", "disable", "delete"])
def test_an_admin_edit_committed_while_a_pass_runs_is_what_the_tick_enqueues(monkeypatch, edit):
    pk = admin_schedule(payload={"v": 1})
    real_parse_timing = service.parse_timing
    edited = []

    def edit_then_parse(*args):
        # The pass read the row; the operator's save commits before it enqueues.
        if not edited:
            edited.append(edit)
            if edit == "rename_and_change":
                changed = spec("digest-v2", payload={"v": 2}, queue="other")
                service.save_schedule(changed, pk=pk, retime=False)
            elif edit == "disable":
                service.set_enabled([pk], False)
            else:
                service.delete_schedules([pk])
        return real_parse_timing(*args)

    monkeypatch.setattr(service, "parse_timing", edit_then_parse)
    at = TICK + timedelta(seconds=1)
    fired = service.run_due(now=at) + service.run_due(now=at)
    assert edited == [edit]
    if edit != "rename_and_change":
        assert fired == [] and not WorkItem.objects.exists()
        return
    # Not the tick of the schedule as it was read: of the schedule as it now is.
    assert [(f.schedule, f.tick) for f in fired] == [("digest-v2", TICK)]
    item = WorkItem.objects.get()
    assert item.task_id == unique_key("digest-v2", TICK)
    assert (item.input_data["v"], item.queue_name) == (2, "other")
    assert item.input_data["_schedule"]["name"] == "digest-v2"
    row = Schedule.objects.get()
    assert row.last_work_item_id == item.work_item_id
    assert row.next_run_at == TICK + timedelta(minutes=1)


def test_the_console_says_why_a_schedule_whose_handler_is_gone_is_overdue(leasing_settings):
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    lost = service.save_schedule(spec("lost", work_type="gone.type"))  # its handler was removed
    beat = service.save_schedule(spec("beat"))
    Schedule.objects.update(next_run_at=Now() - timedelta(seconds=40))
    client = Client()
    client.force_login(make_user("root", superuser=True))

    def row(pk: int) -> str:
        html = client.get(reverse("admin:leasing_schedule_changelist")).content.decode()
        start = html.index(f'name="_selected_action" value="{pk}"')
        return html[start : html.index("</tr>", start)]

    # No scheduler pass has recorded why yet: the list names the commonest cause.
    assert "no handler is registered for its work type &#x27;gone.type&#x27;" in row(lost)
    assert [f.schedule for f in service.run_due()] == ["beat"]  # the other one goes on
    assert "overdue by" in row(lost)
    # Then what the scheduler hit, as it recorded it (`last_error`).
    assert "No handler is registered for work type &#x27;gone.type&#x27;" in row(lost)
    assert "overdue" not in row(beat) and "no handler" not in row(beat).lower()


def test_schedules_that_keep_failing_do_not_hold_back_the_ones_due_after_them(
    leasing_settings, caplog
):
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    # Three schedules whose handler is gone come first in the pass's order.
    lost = [spec(f"lost-{n}", work_type="no.such.type") for n in range(3)]
    service.sync_from_settings([*lost, spec("beat")], now=T0)
    Schedule.objects.filter(name__startswith="lost").update(next_run_at=T0)
    # A pass enqueues at most `limit` ticks (500 by default); the failing ones are
    # retried each pass and must not take the good one's place.
    fired = service.run_due(now=T0 + timedelta(seconds=61), limit=2)
    assert [f.schedule for f in fired] == ["beat"]
    assert WorkItem.objects.get().task_id == unique_key("beat", TICK)
    assert caplog.text.count("cannot enqueue its tick") == 3
    assert set(
        Schedule.objects.filter(name__startswith="lost").values_list("next_run_at", flat=True)
    ) == {T0}


def test_a_schedule_that_fails_again_after_it_recovered_is_an_error_again(leasing_settings, caplog):
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    service.sync_from_settings([spec(work_type="report.gone")], now=T0)
    reported: set[tuple[str, str]] = set()  # what a scheduler's loop keeps across passes

    def errors() -> int:
        return sum(1 for r in caplog.records if r.levelno == logging.ERROR)

    assert service.run_due(now=T0 + timedelta(seconds=61), reported=reported) == []
    assert service.run_due(now=T0 + timedelta(seconds=62), reported=reported) == []
    assert errors() == 1  # the same failure again is not another ERROR line
    leasing_settings(ALLOW_UNREGISTERED_TYPES=True)  # the handler is back
    assert len(service.run_due(now=T0 + timedelta(seconds=63), reported=reported)) == 1
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)  # and gone again: a new incident
    assert service.run_due(now=T0 + timedelta(seconds=121), reported=reported) == []
    assert errors() == 2


def test_a_late_pass_in_the_hour_the_clocks_go_back_enqueues_the_latest_tick():
    # 2026-10-25 03:00 Paris the clocks go back to 02:00: a quarter-hourly cron ticks
    # through both 02:xx hours (01:00-01:45 UTC is the second one).
    quarterly = spec("quarterly", every=None, cron="*/15 * * * *", timezone="Europe/Paris")
    service.sync_from_settings([quarterly], now=datetime(2026, 10, 25, 1, 5, tzinfo=UTC))
    row = Schedule.objects.get()
    assert row.next_run_at == datetime(2026, 10, 25, 1, 15, tzinfo=UTC)  # 02:15, the second one
    # The scheduler comes back at 02:31 (second time round): 02:15 and 02:30 are due.
    [fired] = service.run_due(now=datetime(2026, 10, 25, 1, 31, tzinfo=UTC))
    assert (fired.tick, fired.ticks) == (datetime(2026, 10, 25, 1, 30, tzinfo=UTC), 2)
    about = WorkItem.objects.get().input_data["_schedule"]
    assert (about["tick"], about["skipped"]) == ("2026-10-25T01:30:00+00:00", 1)
    row.refresh_from_db()
    assert row.next_run_at == datetime(2026, 10, 25, 1, 45, tzinfo=UTC)


def test_switching_on_a_schedule_whose_cron_cannot_be_read_here_says_so(monkeypatch):
    # Synced by a scheduler host with cronsim; switched on from a web host without it.
    service.sync_from_settings([spec("nightly", every=None, cron="0 3 * * *"), spec("beat")])
    pks = dict(Schedule.objects.values_list("name", "pk"))
    service.set_enabled(pks.values(), False)
    monkeypatch.setitem(sys.modules, "cronsim", None)  # `import cronsim` raises ImportError
    client = Client()
    client.force_login(make_user("root", superuser=True))
    change = reverse("admin:leasing_schedule_change", args=[pks["nightly"]])
    page = client.post(change, {"enabled": "on"}, follow=True)
    shown = [str(m) for m in page.context["messages"]]
    assert len(shown) == 1, shown  # not "changed successfully"
    assert "'nightly' stays off" in shown[0] and "cronsim" in shown[0]
    assert not Schedule.objects.filter(enabled=True).exists()
    assert not LogEntry.objects.exists()  # nor a change in the object's history
    # The list's action: the other schedule is switched on all the same.
    listing = reverse("admin:leasing_schedule_changelist")
    selected = [str(pk) for pk in pks.values()]
    page = client.post(
        listing, {"action": "enable_selected", "_selected_action": selected}, follow=True
    )
    shown = [str(m) for m in page.context["messages"]]
    assert len(shown) == 2 and "'nightly' stays off" in shown[0] and "cronsim" in shown[0]
    assert shown[1] == "1 schedule(s) enabled."
    assert list(Schedule.objects.filter(enabled=True).values_list("name", flat=True)) == ["beat"]
