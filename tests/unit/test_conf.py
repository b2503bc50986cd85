"""Typed settings (leasing.conf) and system checks (leasing.checks)."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from leasing.checks import check_database, check_settings, check_time_zone
from leasing.conf import LeasingSettings, get_settings, read_settings
from leasing.exceptions import LeasingConfigurationError
from leasing.handlers import registry


def test_defaults_are_the_spec_defaults():
    conf, problems = read_settings({})
    assert problems == ()
    assert conf == LeasingSettings()
    assert conf.lease_duration == 300
    assert conf.heartbeat_interval == 30
    assert conf.heartbeat_max_failures == 3
    assert conf.sweep_interval == 60
    assert conf.checkpoint_retention == 100
    assert conf.max_retries == 3
    assert conf.stale_heartbeat == 120
    assert conf.idempotency_ttl == 24 * 3600
    assert (conf.extender_interval, conf.extender_extension, conf.extender_enabled) == (
        60,
        300,
        True,
    )
    assert conf.max_payload_bytes == 1024 * 1024


def test_settings_are_read_lazily_and_follow_changes(settings):
    settings.LEASING = {"LEASE_DURATION": 10, "heartbeat_interval": 2}
    assert get_settings().lease_duration == 10.0
    assert get_settings().heartbeat_interval == 2.0
    settings.LEASING = {}
    assert get_settings().lease_duration == 300.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"LEASE_DURATIN": 3}, "Unknown setting LEASING['LEASE_DURATIN']"),
        ({"LEASE_DURATION": 0}, "must be a positive number"),
        ({"LEASE_DURATION": "300"}, "must be a number"),
        ({"MAX_RETRIES": -1}, "must be at least 0"),
        ({"HEARTBEAT_MAX_FAILURES": 1.5}, "must be an integer"),
        ({"PREFETCH": -1}, "must be at least 0"),
        ({"PREFETCH": 1001}, "must be at most 1000"),
        ({"EXTENDER_ENABLED": "yes"}, "True or False"),
        ({"HANDLERS": []}, "must be a dict"),
        ({"MAX_ABANDONED_RUNS": -1}, "must be at least 0"),
        ({"MAX_ABANDONED_RUNS": 2.5}, "must be an integer"),
    ],
)
def test_bad_settings_raise_a_configuration_error(overrides, message):
    [problem] = read_settings(overrides)[1]
    error = problem.error()
    assert isinstance(error, LeasingConfigurationError)
    assert isinstance(error, ImproperlyConfigured)
    assert message in str(error)


def test_prefetch_is_adaptive_unless_set():
    assert read_settings({})[0].prefetch is None
    assert read_settings({"PREFETCH": 0})[0].prefetch == 0


def test_a_retired_key_is_ignored_with_a_warning_not_an_error(settings):
    """A project upgraded with RETRY_JITTER still set keeps running; the check says what
    to do."""
    settings.LEASING = {"RETRY_JITTER": 0.1, "LEASE_DURATION": 600}
    assert get_settings().lease_duration == 600
    # Retries still spread by +/-25%, not by the retired key's 10%.
    from leasing.services.terms import retry_backoff_seconds

    delay = get_settings().retry_backoff_base * 2  # the first retry's, before the spread
    spreads = [abs(retry_backoff_seconds(1) - delay) / delay for _ in range(200)]
    assert max(spreads) > 0.1 and max(spreads) <= 0.25
    [warning] = check_settings()
    assert warning.id == "leasing.W005"
    assert "LEASING['RETRY_JITTER'] is no longer read" in warning.msg


def test_check_reports_invalid_settings(settings):
    settings.LEASING = {"SWEEP_INTERVAL": -1}
    [message] = check_settings()
    assert message.id == "leasing.E001"
    assert "SWEEP_INTERVAL" in message.msg


def test_check_reports_a_bad_bound_on_abandoned_runs(settings):
    """A worker reads MAX_ABANDONED_RUNS at start-up: the check refuses what it would."""
    settings.LEASING = {"MAX_ABANDONED_RUNS": "four"}
    [message] = check_settings()
    assert message.id == "leasing.E001"
    assert "MAX_ABANDONED_RUNS" in message.msg
    settings.LEASING = {"MAX_ABANDONED_RUNS": 0}
    assert check_settings() == []
    assert get_settings().max_abandoned_runs == 0


def test_check_warns_about_slow_recovery_and_late_loss_detection(settings):
    settings.LEASING = {"LEASE_DURATION": 60, "HEARTBEAT_INTERVAL": 30, "SWEEP_INTERVAL": 120}
    assert sorted(m.id for m in check_settings()) == ["leasing.W002", "leasing.W003"]


def test_check_warns_when_the_default_heartbeat_is_not_below_stale(settings):
    settings.LEASING = {"STALE_HEARTBEAT": 30}
    [warning] = check_settings()
    assert warning.id == "leasing.W004"
    assert "LEASING['HEARTBEAT_INTERVAL'] (30s)" in warning.msg
    assert "STALE_HEARTBEAT" in warning.msg


def test_check_warns_about_a_work_type_renewed_less_often_than_stale(settings):
    """Each lease is renewed on its own type's interval: a 200 s type's healthy leases
    would read as stale on the console (STALE_HEARTBEAT 120 s)."""
    settings.LEASING = {}
    registry.register("test.hourly", lambda ctx: None, heartbeat_interval=200, lease_duration=900)
    try:
        [warning] = check_settings()
    finally:
        registry.unregister("test.hourly")
    assert warning.id == "leasing.W004"
    assert "work type 'test.hourly' (200s)" in warning.msg
    assert "HEARTBEAT_INTERVAL" not in warning.msg  # the default (30 s) is fine
    assert check_settings() == []


def test_default_settings_pass_the_checks(settings):
    settings.LEASING = {}
    assert check_settings() == []
    assert check_time_zone() == []


@pytest.mark.django_db  # the check reads the database's settings (in memory here)
def test_check_refuses_use_tz_off(settings):
    """With USE_TZ off the ORM's naive datetimes meet the engine's aware ones."""
    settings.USE_TZ = False
    [message] = check_time_zone()
    assert message.id == "leasing.E008"
    assert "USE_TZ = True" in message.msg and "USE_TZ = True" in message.hint
    with pytest.raises(SystemCheckError, match=r"leasing\.E008"):
        call_command("check")


@pytest.mark.parametrize("debug", [False, True])
def test_non_postgres_database_is_warned_about_whatever_debug_says(settings, vendor, debug):
    settings.DEBUG = debug
    messages = check_database()
    if vendor == "postgresql":
        assert messages == []
    else:
        # The suite's SQLite has the options the engine needs: no E004, only W001.
        [warning] = messages
        assert warning.id == "leasing.W001"
        assert "SKIP LOCKED" in warning.msg
        assert "leasing.W001" in warning.hint  # how to silence it on purpose


# --- one setting under two spellings -----------------------------------------------------


def test_a_setting_spelt_in_two_cases_is_an_error_naming_both(settings):
    """Keys are read whatever their case: of {"LEASE_DURATION": 30, "lease_duration": 300}
    only the last was read, and the first was dropped without a word."""
    settings.LEASING = {"LEASE_DURATION": 30, "lease_duration": 300}
    [message] = check_settings()
    assert message.id == "leasing.E001"
    assert "LEASE_DURATION" in message.msg and "'lease_duration'" in message.msg
    assert "'LEASE_DURATION'" in message.msg and "only the last, 'lease_duration'" in message.msg
    assert "one key per setting" in message.hint
    with pytest.raises(SystemCheckError, match=r"leasing\.E001"):
        call_command("check", "--tag", "leasing")


def test_a_setting_spelt_in_two_cases_does_not_stop_a_process_that_runs_anyway(settings, caplog):
    """Nothing raises at import or at first use: the last spelling applies, as it always
    did, and the process logs the problem once."""
    settings.LEASING = {"Lease_Duration": 30, "HEARTBEAT_INTERVAL": 5, "lease_duration": 90}
    with caplog.at_level("ERROR", logger="leasing.conf"):
        assert get_settings().lease_duration == 90.0
        assert get_settings().heartbeat_interval == 5.0
    [record] = caplog.records
    assert "'Lease_Duration', 'lease_duration'" in record.getMessage()
    assert "The last spelling applies" in record.getMessage()


def test_a_shadowed_spelling_is_not_read(settings):
    """Only the spelling that applies is judged: a bad value under the other one is not
    an error of its own, the two spellings are."""
    conf, problems = read_settings({"lease_duration": "bad", "LEASE_DURATION": 60})
    assert conf.lease_duration == 60.0
    [problem] = problems
    assert problem.entry and problem.spelt_twice and problem.setting == "LEASE_DURATION"


@pytest.mark.parametrize("setting", ["QUEUE_LIMITS", "SCHEDULES", "RATE_LIMITS"])
def test_a_setting_of_entries_spelt_twice_is_one_error(settings, setting):
    """Not an error of the entries' own check (E006, E012): of LEASING's keys."""
    settings.LEASING = {setting: {}, setting.lower(): {}}
    [error] = [m for m in run_checks(tags=["leasing"]) if m.is_serious()]
    assert error.id == "leasing.E001"
    assert repr(setting) in error.msg and repr(setting.lower()) in error.msg


def test_limit_names_and_settings_in_one_case_are_not_spelt_twice():
    """Queue and work type names are case-sensitive: two queues, not one spelt twice."""
    conf, problems = read_settings({"QUEUE_LIMITS": {"Mail": 1, "mail": 2}, "MAX_RETRIES": 1})
    assert problems == ()
    assert conf.queue_limits == {"Mail": 1, "mail": 2}
