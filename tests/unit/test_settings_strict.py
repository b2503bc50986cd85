"""Settings checked as strictly as they are used (issue 39): "a setting that manage.py
check accepts never stops work at run time".

* `manage.py check` applies the runtime's rules to every LEASING entry (storable
  text, sizes, depths, the ranges the runtime takes, known database aliases),
  one error per bad entry: a QUEUE_LIMITS name with a NUL used to pass the check
  and then stop every worker at its first claim; a schedule with a NUL in its
  payload used to pass and then fail at every tick.
* At run time (a process that did not run the check) a bad limit or schedule
  costs only itself: logged once, skipped; the other limits, schedules, the
  worker and the scheduler go on. A commanded process (runworker,
  runscheduler) runs the check first and refuses to start in one line.
* The scheduler isolates a row of its table that fails at its tick (written by
  hand, or outgrown by a lowered MAX_PAYLOAD_BYTES): the other schedules tick,
  the row is logged once per scheduler, not once a pass.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks

from leasing import validation
from leasing.conf import get_settings, read_settings
from leasing.exceptions import LeasingConfigurationError
from leasing.handlers import registry
from leasing.models import Schedule
from leasing.sweep import sweep
from leasing.ticks import MAX_CRON_LENGTH, MAX_TIMEZONE_LENGTH, parse_schedule

MIB = 1024 * 1024
GOOD = {"work_type": "test.noop", "every": 3600}


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def errors(check_id: str) -> list[str]:
    return [m.msg for m in run_checks(tags=["leasing"]) if m.id == check_id]


def serious() -> list[str]:
    return [f"{m.id}: {m.msg}" for m in run_checks(tags=["leasing"]) if m.is_serious()]


# --- the check: limits --------------------------------------------------------------------

BAD_LIMIT_NAMES = [
    pytest.param("q\x00", "must not contain NUL characters", id="nul"),
    pytest.param("q\ud800", "must not contain lone surrogate characters", id="surrogate"),
    pytest.param("\udfffq", "must not contain lone surrogate characters", id="surrogate-first"),
    pytest.param("q" * 256, "must be at most 255 characters", id="longer-than-a-queue-name"),
]


@pytest.mark.parametrize("setting", ["QUEUE_LIMITS", "WORK_TYPE_LIMITS"])
@pytest.mark.parametrize(("name", "words"), BAD_LIMIT_NAMES)
def test_the_check_reports_a_limit_name_no_database_stores(settings, setting, name, words):
    settings.LEASING = {**settings.LEASING, setting: {name: 1, "good": 2}}
    [message] = errors("leasing.E001")
    assert f"LEASING[{setting!r}] key {name!r}" in message and words in message
    [problem] = read_settings({setting: {name: 1}})[1]
    assert words in problem.message


def test_the_check_reports_each_bad_limit_once_and_nothing_else(settings):
    settings.LEASING = {
        **settings.LEASING,
        "QUEUE_LIMITS": {"q\x00": 1, "good": 2, "q\ud800": 3, "zero": 0},
        "WORK_TYPE_LIMITS": {"t\x00": 1, "fine": 4},
    }
    found = errors("leasing.E001")
    assert len(found) == 4
    for needle in ("'q\\x00'", "'q\\ud800'", "['zero'] must be a positive integer", "'t\\x00'"):
        assert sum(needle in message for message in found) == 1, (needle, found)
    assert serious() == [f"leasing.E001: {message}" for message in found]


# --- the check: schedules -----------------------------------------------------------------

LONG_CRON = " ".join(
    [
        ",".join(map(str, range(60))),
        ",".join(map(str, range(24))),
        ",".join(map(str, range(1, 32))),
        "*",
        "*",
    ]
)

BAD_SCHEDULES = [
    pytest.param("n\x00", GOOD, "without NUL or lone surrogate", id="nul-in-name"),
    pytest.param("n\ud800", GOOD, "without NUL or lone surrogate", id="surrogate-in-name"),
    pytest.param("s", {**GOOD, "work_type": "t\x00"}, "work_type must be", id="nul-in-type"),
    pytest.param("s", {**GOOD, "work_type": "t\ud800"}, "work_type must be", id="surr-in-type"),
    pytest.param("s", {**GOOD, "queue": "q\x00"}, "queue must be", id="nul-in-queue"),
    pytest.param("s", {**GOOD, "queue": "q\udc00"}, "queue must be", id="surrogate-in-queue"),
    pytest.param("s", {**GOOD, "queue": "q" * 256}, "at most 255", id="queue-too-long"),
    pytest.param("s", {**GOOD, "payload": {"a": "\x00"}}, "NUL character", id="nul-in-payload"),
    pytest.param("s", {**GOOD, "payload": {"a\x00": 1}}, "NUL character", id="nul-in-a-key"),
    pytest.param(
        "s", {**GOOD, "payload": {"a": "\ud800"}}, "lone surrogate", id="surrogate-in-payload"
    ),
    pytest.param(
        "s", {**GOOD, "payload": {"a": "x" * (MIB + 1)}}, "over the limit", id="payload-over-1mib"
    ),
    # Fits alone; with the `_schedule` entry each tick adds, every tick would be refused.
    pytest.param(
        "s",
        {**GOOD, "payload": {"a": "x" * (MIB - 20)}},
        "with the '_schedule' entry",
        id="payload-over-1mib-with-its-tick",
    ),
    pytest.param("s", {**GOOD, "payload": {"a": nested(101)}}, "nested more", id="101-deep"),
    pytest.param("s", {**GOOD, "payload": {"a": nested(100_000)}}, "nested more", id="1e5-deep"),
    pytest.param("s", {**GOOD, "payload": {"a": {1, 2}}}, "not JSON-serializable", id="a-set"),
    pytest.param(
        "s", {"work_type": "test.noop", "cron": "0 3 * * *\x00"}, "cron must be", id="nul-in-cron"
    ),
    pytest.param(
        "s",
        {"work_type": "test.noop", "cron": LONG_CRON},
        f"at most {MAX_CRON_LENGTH} characters",
        id="cron-wider-than-its-column",
    ),
    pytest.param("s", {**GOOD, "timezone": "UTC\x00"}, "unknown time zone", id="nul-in-zone"),
]


@pytest.mark.parametrize(("name", "definition", "words"), BAD_SCHEDULES)
def test_the_check_reports_a_schedule_the_runtime_would_refuse(settings, name, definition, words):
    settings.LEASING = {**settings.LEASING, "SCHEDULES": {name: definition, "good": GOOD}}
    [message] = errors("leasing.E006")
    assert message.startswith("LEASING['SCHEDULES']: ")
    assert repr(name) in message and words in message
    conf, problems = read_settings(settings.LEASING)
    assert list(conf.schedules) == ["good"] and len(problems) == 1


def test_a_schedule_whose_work_type_has_no_handler_is_reported_when_types_must_be_known(
    settings,
):
    schedules = {"lost": {**GOOD, "work_type": "no.such.type"}, "good": GOOD}
    settings.LEASING = {**settings.LEASING, "SCHEDULES": schedules}
    assert errors("leasing.E006") == []  # the suite allows unregistered types
    settings.LEASING = {**settings.LEASING, "ALLOW_UNREGISTERED_TYPES": False}
    [message] = errors("leasing.E006")
    assert "'lost'" in message and "no handler is registered for work type 'no.such.type'" in (
        message
    )


def test_the_cron_and_zone_limits_are_the_columns_widths():
    field = Schedule._meta.get_field
    assert (field("cron").max_length, field("timezone").max_length) == (
        MAX_CRON_LENGTH,
        MAX_TIMEZONE_LENGTH,
    )


def test_a_payload_is_kept_as_it_will_be_stored():
    """Non-string keys become strings (as in the JSON column), so the fingerprint that
    sorts the keys cannot fail on a mix of them."""
    spec = parse_schedule("s", {**GOOD, "payload": {1: "a", "b": (1, 2)}})
    assert spec.payload == {"1": "a", "b": [1, 2]}
    assert len(spec.fingerprint) == 32


# --- the check: the other settings --------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        # Each passed the check and then failed where the runtime takes the value.
        ({"LEASE_DURATION": 1e12}, "at most"),  # WorkerRuntime: InvalidDuration
        ({"POLL_INTERVAL": float(10**10)}, "at most"),
        ({"IDEMPOTENCY_TTL": 10**11}, "at most"),
        ({"SWEEP_BATCH_SIZE": 5001}, "at most 5000"),  # RecoverySweep: InvalidInput
        ({"MAX_RETRIES": 2**31}, "at most 2147483647"),  # each item's max_retries column
        ({"CHECKPOINT_RETENTION": 2**63}, "at most"),
        ({"METRICS_TOKEN": "tok\x00en"}, "NUL"),
        ({"METRICS_TOKEN": "tok\ud800"}, "lone surrogate"),
    ],
)
def test_the_check_applies_the_ranges_the_runtime_takes(settings, overrides, words):
    settings.LEASING = {**settings.LEASING, **overrides}
    [message] = errors("leasing.E001")
    assert next(iter(overrides)) in message and words in message


def test_the_sweep_batch_limit_is_the_sweeps():
    assert validation.MAX_SWEEP_BATCH_SIZE == sweep.MAX_BATCH_SIZE
    conf, problems = read_settings({"SWEEP_BATCH_SIZE": sweep.MAX_BATCH_SIZE})
    assert problems == () and conf.sweep_batch_size == 5000


def test_the_check_reports_an_unknown_listen_database(settings):
    settings.LEASING = {**settings.LEASING, "LISTEN_DATABASE": "direct"}
    [message] = errors("leasing.E009")
    assert "'direct'" in message and "'default'" in message
    settings.LEASING = {**settings.LEASING, "LISTEN_DATABASE": "default"}
    assert errors("leasing.E009") == []


def test_the_check_reports_a_handlers_entry_that_cannot_be_loaded(settings):
    settings.LEASING = {**settings.LEASING, "HANDLERS": {"x.job": "no_such_module.run"}}
    registry.reset_settings()  # the registry reads HANDLERS once per process
    try:
        [message] = errors("leasing.E010")
    finally:
        settings.LEASING = {k: v for k, v in settings.LEASING.items() if k != "HANDLERS"}
        registry.reset_settings()
    assert "LEASING['HANDLERS']['x.job']" in message and "no_such_module.run" in message


# --- run time: limits ---------------------------------------------------------------------


# --- run time: schedules ------------------------------------------------------------------


def test_a_bad_key_that_is_not_an_entry_still_stops_the_settings(settings):
    """Only limits and schedules are made of entries that can be skipped: a bad lease
    duration has no safe stand-in, so every use of the settings raises it."""
    settings.LEASING = {**settings.LEASING, "LEASE_DURATION": 0, "QUEUE_LIMITS": {"q\x00": 1}}
    with pytest.raises(LeasingConfigurationError, match="LEASE_DURATION"):
        get_settings()
    assert len(errors("leasing.E001")) == 2
