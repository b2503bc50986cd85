"""leasing.services.schedules on the database (both passes): syncing the settings,
firing due ticks, the missed-tick policies, enabling and disabling, and the unique
key that keeps a tick from running twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core import checks

from leasing.models import Schedule, WorkItem
from leasing.services import schedules as service
from leasing.ticks import parse_schedule

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, 0, 0, 0, 400_000, tzinfo=UTC)


def spec(name="beat", **definition):
    return parse_schedule(name, {"work_type": "test.noop", "every": 60, **definition})


def test_sync_creates_rows_from_the_settings_starting_at_the_next_tick():
    result = service.sync_from_settings(
        [spec(), spec("nightly", every=None, cron="0 3 * * *", timezone="Europe/Paris")], now=T0
    )
    assert result.written == ("beat", "nightly") and result.removed == ()
    beat = Schedule.objects.get(name="beat")
    assert beat.from_settings and beat.enabled
    assert beat.next_run_at == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert Schedule.objects.get(name="nightly").next_run_at == datetime(
        2026, 1, 1, 2, 0, tzinfo=UTC
    )


def test_sync_leaves_an_unchanged_schedule_alone_and_rewrites_a_changed_one():
    service.sync_from_settings([spec()], now=T0)
    service.set_enabled([Schedule.objects.get().pk], False)
    later = T0 + timedelta(minutes=10)
    assert service.sync_from_settings([spec()], now=later).written == ()
    row = Schedule.objects.get()
    assert row.next_run_at == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)  # not moved by a restart
    assert not row.enabled  # the admin's switch survives
    assert service.sync_from_settings([spec(every=120)], now=later).written == ("beat",)
    row.refresh_from_db()
    assert (row.every, row.next_run_at) == (120, datetime(2026, 1, 1, 0, 12, tzinfo=UTC))
    assert not row.enabled


def test_sync_removes_settings_rows_gone_from_the_settings_but_not_admin_rows():
    service.sync_from_settings([spec(), spec("old")], now=T0)
    service.save_schedule(spec("manual"))
    result = service.sync_from_settings([spec()], now=T0)
    assert result.removed == ("old",)
    assert sorted(Schedule.objects.values_list("name", flat=True)) == ["beat", "manual"]


def test_sync_takes_over_an_admin_row_of_the_same_name():
    service.save_schedule(spec(every=300))
    service.sync_from_settings([spec()], now=T0)
    row = Schedule.objects.get()
    assert row.from_settings and row.every == 60


def test_a_due_tick_enqueues_one_item_once():
    service.sync_from_settings([spec(payload={"to": "ops"}, queue="beats")], now=T0)
    assert service.run_due(now=T0 + timedelta(seconds=30)) == []
    at = T0 + timedelta(seconds=61)
    fired = service.run_due(now=at)
    assert [(f.schedule, f.tick, f.ticks, f.duplicate) for f in fired] == [
        ("beat", datetime(2026, 1, 1, 0, 1, tzinfo=UTC), 1, False)
    ]
    item = WorkItem.objects.get()
    assert item.work_item_id == fired[0].work_item_id
    assert (item.work_type, item.queue_name) == ("test.noop", "beats")
    assert item.task_id == item.unique_key == "schedule:beat:2026-01-01T00:01:00+00:00"
    assert item.input_data == {
        "to": "ops",
        "_schedule": {
            "name": "beat",
            "tick": "2026-01-01T00:01:00+00:00",
            "missed": "skip",
            "skipped": 0,
        },
    }
    row = Schedule.objects.get()
    assert row.next_run_at == datetime(2026, 1, 1, 0, 2, tzinfo=UTC)
    assert row.last_tick_at == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert row.last_work_item_id == item.work_item_id and row.last_run_at is not None
    assert service.run_due(now=at) == []  # the same moment again: nothing more
    assert WorkItem.objects.count() == 1


@pytest.mark.parametrize("policy", ["skip", "catch_up"])
def test_missed_ticks_give_one_item_under_either_policy(policy):
    service.sync_from_settings([spec(missed=policy)], now=T0)
    # No scheduler ran for ten minutes: ticks 00:01 .. 00:10 are due.
    fired = service.run_due(now=T0 + timedelta(minutes=10))
    assert len(fired) == 1 and fired[0].ticks == 10
    about = WorkItem.objects.get().input_data["_schedule"]
    assert about["tick"] == "2026-01-01T00:10:00+00:00"
    if policy == "skip":
        assert about["skipped"] == 9 and "since" not in about
    else:
        assert (about["since"], about["ticks"]) == ("2026-01-01T00:01:00+00:00", 10)
    # Resumes from now, whichever the policy.
    assert Schedule.objects.get().next_run_at == datetime(2026, 1, 1, 0, 11, tzinfo=UTC)


def test_a_disabled_schedule_does_not_fire_and_resumes_from_now_when_enabled():
    service.sync_from_settings([spec()], now=T0)
    pk = Schedule.objects.get().pk
    assert service.set_enabled([pk], False) == 1
    assert service.set_enabled([pk], False) == 0  # already off
    assert service.run_due(now=T0 + timedelta(hours=1)) == []
    assert service.set_enabled([pk], True) == 1
    row = Schedule.objects.get()
    assert row.enabled and row.next_run_at > datetime.now(UTC) - timedelta(minutes=2)


def test_a_tick_moved_back_still_enqueues_only_once():
    service.sync_from_settings([spec()], now=T0)
    at = T0 + timedelta(seconds=61)
    first = service.run_due(now=at)
    # An operator (or a restored backup) moves next_run_at back to the tick that ran.
    Schedule.objects.update(next_run_at=datetime(2026, 1, 1, 0, 1, tzinfo=UTC))
    again = service.run_due(now=at)
    assert len(again) == 1 and again[0].duplicate
    assert again[0].work_item_id == first[0].work_item_id
    assert WorkItem.objects.count() == 1


def test_a_schedule_that_cannot_enqueue_is_logged_and_retried(leasing_settings, caplog):
    leasing_settings(ALLOW_UNREGISTERED_TYPES=False)
    service.sync_from_settings([spec("lost", work_type="no.such.type"), spec()], now=T0)
    fired = service.run_due(now=T0 + timedelta(seconds=61))
    assert [f.schedule for f in fired] == ["beat"]  # the other one still ran
    assert "schedule lost cannot enqueue its tick" in caplog.text
    assert Schedule.objects.get(name="lost").next_run_at == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)


def test_admin_saves_keep_or_move_the_next_tick():
    pk = service.save_schedule(spec("manual", every=3600))
    row = Schedule.objects.get(pk=pk)
    assert not row.from_settings and row.next_run_at is not None
    Schedule.objects.filter(pk=pk).update(next_run_at=T0)
    service.save_schedule(spec("manual", every=3600, payload={"a": 1}), pk=pk, retime=False)
    row.refresh_from_db()
    assert row.next_run_at == T0 and row.payload == {"a": 1}
    service.save_schedule(spec("manual", every=60), pk=pk, retime=True)
    row.refresh_from_db()
    assert row.next_run_at > T0


def test_settings_rows_cannot_be_rewritten_or_deleted_as_admin_rows():
    service.sync_from_settings([spec()], now=T0)
    pk = Schedule.objects.get().pk
    with pytest.raises(Exception, match="LEASING\\['SCHEDULES'\\]"):
        service.save_schedule(spec(every=5), pk=pk)
    assert service.delete_schedules([pk]) == 0
    assert Schedule.objects.get().every == 60


def test_the_system_check_names_each_bad_schedule(settings):
    settings.LEASING = {
        **settings.LEASING,
        "SCHEDULES": {
            "bad-cron": {"work_type": "x", "cron": "99 * * * *"},
            "bad-zone": {"work_type": "x", "every": 5, "timezone": "Nowhere/Land"},
            "bad-key": {"work_type": "x", "every": 5, "when": "often"},
            "good": {"work_type": "x", "every": 5},
        },
    }
    found = [m for m in checks.run_checks(tags=["leasing"]) if m.id.startswith("leasing.E")]
    assert [m.id for m in found] == ["leasing.E006"] * 3
    text = "\n".join(m.msg for m in found)
    assert "'bad-cron': invalid cron expression" in text
    assert "'bad-zone': unknown time zone 'Nowhere/Land'" in text
    assert "'bad-key': unknown keys ['when']" in text


def test_settings_schedules_are_parsed_into_the_typed_settings(settings):
    from leasing.conf import get_settings

    settings.LEASING = {**settings.LEASING, "SCHEDULES": {"beat": {"work_type": "x", "every": 5}}}
    assert get_settings().schedules["beat"].timing.every == 5
    service.sync_from_settings(now=T0)
    assert Schedule.objects.get().name == "beat"
