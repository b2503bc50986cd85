"""leasing.ticks: when schedules tick (cron in a time zone, intervals), what a late
pass owes under each missed-tick policy, and the validation of LEASING["SCHEDULES"]
entries. Pure functions: no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from leasing.exceptions import InvalidInput
from leasing.services.schedules import item_input, unique_key
from leasing.ticks import MAX_COUNTED_TICKS, Timing, parse_schedule, parse_timing

PARIS = ZoneInfo("Europe/Paris")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_cron_ticks_at_the_wall_time_of_its_time_zone():
    nightly = parse_timing("0 3 * * *", None, "Europe/Paris")
    # Winter: Paris is UTC+1, so 03:00 Paris is 02:00 UTC.
    assert nightly.next_after(utc(2026, 1, 10, 12, 0)) == utc(2026, 1, 11, 2, 0)
    # Summer: UTC+2.
    assert nightly.next_after(utc(2026, 7, 10, 12, 0)) == utc(2026, 7, 11, 1, 0)
    # Strictly after: a tick exactly at the moment is not "next".
    assert nightly.next_after(utc(2026, 7, 11, 1, 0)) == utc(2026, 7, 12, 1, 0)


def test_cron_across_the_spring_forward_night():
    # 2026-03-29 02:00 Paris the clocks jump to 03:00: 02:30 does not exist.
    half_past_two = parse_timing("30 2 * * *", None, "Europe/Paris")
    tick = half_past_two.next_after(utc(2026, 3, 28, 12, 0))
    assert tick == datetime(2026, 3, 29, 3, 0, tzinfo=PARIS).astimezone(UTC)  # runs at 03:00
    assert tick == utc(2026, 3, 29, 1, 0)
    # The day after, back to 02:30 (now UTC+2).
    assert half_past_two.next_after(tick) == utc(2026, 3, 30, 0, 30)
    # A daily 03:00 keeps its wall time: 23 hours between the two ticks that night.
    nightly = parse_timing("0 3 * * *", None, "Europe/Paris")
    before = nightly.next_after(utc(2026, 3, 27, 12, 0))
    after = nightly.next_after(before)
    assert after - before == timedelta(hours=23)


def test_cron_across_the_fall_back_night_runs_once():
    # 2026-10-25 03:00 Paris the clocks go back to 02:00: 02:30 happens twice.
    half_past_two = parse_timing("30 2 * * *", None, "Europe/Paris")
    first = half_past_two.next_after(utc(2026, 10, 24, 12, 0))
    assert first == utc(2026, 10, 25, 0, 30)  # the first 02:30 (UTC+2)
    second = half_past_two.next_after(first)
    assert second == utc(2026, 10, 26, 1, 30)  # not 01:30 UTC the same night
    nightly = parse_timing("0 3 * * *", None, "Europe/Paris")
    before = nightly.next_after(utc(2026, 10, 23, 12, 0))  # 24th 03:00, UTC+2
    assert nightly.next_after(before) - before == timedelta(hours=25)


def test_utc_cron_and_six_field_seconds():
    every_ten_seconds = parse_timing("*/10 * * * * *", None, "UTC")
    assert every_ten_seconds.next_after(utc(2026, 1, 1, 0, 0, 3)) == utc(2026, 1, 1, 0, 0, 10)
    assert every_ten_seconds.latest_at_or_before(utc(2026, 1, 1, 0, 0, 10)) == utc(
        2026, 1, 1, 0, 0, 10
    )


def test_intervals_tick_on_multiples_of_the_epoch_whatever_the_time_zone():
    timing = parse_timing(None, 30, "Asia/Kolkata")
    assert timing.next_after(utc(2026, 1, 1, 0, 0, 5)) == utc(2026, 1, 1, 0, 0, 30)
    assert timing.next_after(utc(2026, 1, 1, 0, 0, 30)) == utc(2026, 1, 1, 0, 1, 0)
    moment = utc(2026, 1, 1, 0, 0, 59, 999_999)
    assert timing.latest_at_or_before(moment) == utc(2026, 1, 1, 0, 0, 30)


def test_nothing_is_due_before_the_next_tick():
    timing = parse_timing(None, 60, "UTC")
    assert timing.due(utc(2026, 1, 1, 0, 1), utc(2026, 1, 1, 0, 0, 59)) is None


def test_an_on_time_tick_is_due_once():
    timing = parse_timing(None, 60, "UTC")
    due = timing.due(utc(2026, 1, 1, 0, 1), utc(2026, 1, 1, 0, 1, 0, 400_000))
    assert due is not None
    assert (due.tick, due.first, due.ticks, due.missed) == (
        utc(2026, 1, 1, 0, 1),
        utc(2026, 1, 1, 0, 1),
        1,
        0,
    )
    assert due.next_run_at == utc(2026, 1, 1, 0, 2)


def test_missed_cron_ticks_give_one_item_for_the_latest_and_count_the_rest():
    # The scheduler was down from before 3 nights' ticks to 11:00 UTC.
    nightly = parse_timing("0 3 * * *", None, "Europe/Paris")
    first = utc(2026, 1, 10, 2, 0)
    due = nightly.due(first, utc(2026, 1, 12, 11, 0))
    assert due is not None
    assert due.tick == utc(2026, 1, 12, 2, 0)  # the most recent due tick
    assert due.first == first
    assert due.ticks == 3 and due.missed == 2
    assert due.next_run_at == utc(2026, 1, 13, 2, 0)  # resumes from now


def test_missed_ticks_across_a_dst_change_are_counted_in_wall_time():
    nightly = parse_timing("0 3 * * *", None, "Europe/Paris")
    due = nightly.due(utc(2026, 3, 28, 2, 0), utc(2026, 3, 30, 12, 0))
    assert due is not None
    assert due.ticks == 3  # 28th (UTC+1), 29th and 30th (UTC+2)
    assert due.tick == utc(2026, 3, 30, 1, 0)


def test_the_count_of_missed_ticks_is_capped():
    every_second = parse_timing("* * * * * *", None, "UTC")
    due = every_second.due(utc(2026, 1, 1), utc(2026, 1, 2))
    assert due is not None and due.ticks == MAX_COUNTED_TICKS
    assert due.tick == utc(2026, 1, 2)


def test_skip_and_catch_up_tell_the_item_what_it_stands_for():
    timing = parse_timing(None, 60, "UTC")
    due = timing.due(utc(2026, 1, 1, 0, 1), utc(2026, 1, 1, 0, 5, 30))
    assert due is not None and due.ticks == 5
    skip = item_input("digest", {"to": "ops"}, "skip", due)
    assert skip == {
        "to": "ops",
        "_schedule": {
            "name": "digest",
            "tick": "2026-01-01T00:05:00+00:00",
            "missed": "skip",
            "skipped": 4,
        },
    }
    catch_up = item_input("digest", {}, "catch_up", due)
    assert catch_up["_schedule"] == {
        "name": "digest",
        "tick": "2026-01-01T00:05:00+00:00",
        "missed": "catch_up",
        "since": "2026-01-01T00:01:00+00:00",
        "ticks": 5,
    }


def test_the_unique_key_names_the_schedule_and_the_tick_in_utc():
    tick = datetime(2026, 1, 1, 3, 0, tzinfo=PARIS)
    assert unique_key("nightly", tick) == "schedule:nightly:2026-01-01T02:00:00+00:00"


@pytest.mark.parametrize(
    ("definition", "words"),
    [
        ({"work_type": "x", "cron": "61 * * * *"}, "invalid cron expression"),
        ({"work_type": "x", "cron": "0 3 * *"}, "must have 5 fields"),
        ({"work_type": "x", "cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"work_type": "x", "cron": "0 3 * * *", "every": 5}, "exactly one of"),
        ({"work_type": "x"}, "exactly one of"),
        ({"work_type": "x", "every": 0}, "positive whole number"),
        ({"work_type": "x", "every": True}, "positive whole number"),
        ({"work_type": "x", "every": 5, "colour": "red"}, "unknown keys ['colour']"),
        ({"every": 5}, "'work_type' is required"),
        ({"work_type": "x", "every": 5, "missed": "later"}, "'skip' or 'catch_up'"),
        ({"work_type": "x", "every": 5, "payload": [1]}, "JSON object"),
        ({"work_type": "x", "every": 5, "payload": {"_schedule": 1}}, "_schedule"),
        ({"work_type": "x", "every": 5, "payload": {"n": float("nan")}}, "JSON-serializable"),
        ({"work_type": "", "every": 5}, "work_type must be non-empty"),
        ("0 3 * * *", "must be a dict"),
    ],
)
def test_bad_schedule_definitions_say_what_is_wrong(definition, words):
    with pytest.raises(InvalidInput) as info:
        parse_schedule("nightly", definition)
    assert words in str(info.value)
    assert "nightly" in str(info.value)


def test_a_good_definition_and_its_fingerprint():
    spec = parse_schedule(
        "nightly",
        {
            "work_type": "report.build",
            "cron": "0  3 * * *",
            "timezone": "Europe/Paris",
            "payload": {"format": "pdf"},
            "queue": "reports",
            "missed": "catch_up",
        },
    )
    assert spec.timing == Timing(cron="0 3 * * *", every=None, timezone="Europe/Paris")
    assert (spec.queue, spec.missed, spec.payload) == ("reports", "catch_up", {"format": "pdf"})
    same = parse_schedule(
        "nightly",
        {
            "work_type": "report.build",
            "cron": "0 3 * * *",
            "timezone": "Europe/Paris",
            "payload": {"format": "pdf"},
            "queue": "reports",
            "missed": "catch_up",
        },
    )
    other = parse_schedule(
        "nightly",
        {
            "work_type": "report.build",
            "cron": "0 4 * * *",
            "timezone": "Europe/Paris",
            "payload": {"format": "pdf"},
            "queue": "reports",
            "missed": "catch_up",
        },
    )
    assert spec.fingerprint == same.fingerprint != other.fingerprint


def test_without_cronsim_cron_says_which_extra_and_intervals_still_work(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cronsim", None)  # `import cronsim` raises ImportError
    with pytest.raises(InvalidInput, match=r"pip install 'django-leasing\[schedule\]'"):
        parse_schedule("nightly", {"work_type": "x", "cron": "0 3 * * *"})
    assert parse_schedule("beat", {"work_type": "x", "every": 5}).timing.every == 5
