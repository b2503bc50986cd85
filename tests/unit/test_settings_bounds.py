"""Settings `manage.py check` used to accept and the runtime then refused or choked on
("a setting that manage.py check accepts never stops work at run time"):

* a work type's own lease or heartbeat interval that, with the default other one, leaves
  the interval not below the lease (runworker refused to start: every queue stopped);
* AUTOCOMMIT = False on the database leasing writes through (nothing ever committed);
* limits, fairness weights and a handler's max_retries beyond what the columns and the
  claim's SQL hold;
* a METRICS_TOKEN no request can present, a HANDLERS module that raises as it loads,
  a sweep interval django-q2 cannot schedule, a stop grace multiprocessing cannot wait,
  a lower-case LEASING_LOG_LEVEL.
"""

from __future__ import annotations

import logging
import multiprocessing
import runpy
import sys
import time
from pathlib import Path

import pytest
from django.core.checks import run_checks

from leasing.exceptions import InvalidHeartbeatInterval, InvalidInput, LeasingConfigurationError
from leasing.handlers import registry
from leasing.sweep.schedule import schedule_minutes
from leasing.tasks import TASK_WORK_TYPE, register_task_handler
from leasing.worker.children import Child
from leasing.worker.options import WorkerOptions, resolve
from tests.testapp.handlers import noop

NOOP = "tests.testapp.handlers.noop"
PROJECT_SETTINGS = Path(__file__).resolve().parents[2] / "project" / "settings.py"


def messages(check_id: str) -> list[str]:
    return [m.msg for m in run_checks(tags=["leasing"]) if m.id == check_id]


@pytest.fixture
def handlers_setting(settings):
    """Set LEASING['HANDLERS'] (the registry reads it once per process) and undo it."""

    def apply(entries: dict, **overrides: object) -> None:
        settings.LEASING = {**settings.LEASING, "HANDLERS": entries, **overrides}
        registry.reset_settings()

    yield apply
    for work_type in ("probe.short", "t", "x"):
        registry.unregister(work_type)
    registry.reset_settings()


# --- 1. a work type's lease and heartbeat (leasing.E002) ----------------------------------


def runtime_refuses() -> bool:
    """Whether a worker serving every registered type would refuse to start."""
    try:
        resolve(WorkerOptions())
    except InvalidHeartbeatInterval:
        return True
    return False


@pytest.mark.parametrize(
    ("entry", "overrides", "words"),
    [
        # The type's lease below the default heartbeat interval (30s).
        ({"handler": NOOP, "lease_duration": 10}, {}, "(30s, LEASING['HEARTBEAT_INTERVAL'])"),
        # The type's heartbeat interval above the default lease (300s).
        ({"handler": NOOP, "heartbeat_interval": 400}, {}, "(300s, LEASING['LEASE_DURATION'])"),
        (
            {"handler": NOOP, "heartbeat_interval": 60},
            {"LEASE_DURATION": 50, "HEARTBEAT_INTERVAL": 5},
            "(60s, its heartbeat_interval)",
        ),
    ],
)
def test_a_types_heartbeat_not_below_its_effective_lease_is_e002_naming_the_type(
    handlers_setting, entry, overrides, words
):
    handlers_setting({"probe.short": entry}, **overrides)
    [message] = messages("leasing.E002")
    assert "Work type 'probe.short'" in message and words in message
    assert runtime_refuses()  # what the check now reports is what stopped every worker


def test_a_decorated_handlers_interval_is_judged_against_the_default_lease(settings):
    settings.LEASING = {**settings.LEASING, "LEASE_DURATION": 50, "HEARTBEAT_INTERVAL": 5}
    registry.register("t", noop, heartbeat_interval=60)
    try:
        [message] = messages("leasing.E002")
        assert runtime_refuses()
    finally:
        registry.unregister("t")
    assert "Work type 't'" in message
    assert messages("leasing.E002") == []


def test_the_tasks_backends_type_is_judged_too(settings):
    settings.TASKS = {
        "default": {"BACKEND": "leasing.tasks.LeasingBackend", "OPTIONS": {"LEASE_DURATION": 10}}
    }
    register_task_handler()
    try:
        [message] = messages("leasing.E002")
    finally:
        registry.register(TASK_WORK_TYPE, registry.get(TASK_WORK_TYPE).func, replace=True)
    assert f"Work type {TASK_WORK_TYPE!r}" in message


def test_types_whose_lease_and_interval_fit_pass(handlers_setting):
    handlers_setting(
        {
            "probe.short": {"handler": NOOP, "lease_duration": 60, "heartbeat_interval": 6},
            "t": {"handler": NOOP, "heartbeat_interval": 200},  # below the 300s default
        }
    )
    assert messages("leasing.E002") == []
    assert not runtime_refuses()


# --- 2. AUTOCOMMIT (leasing.E014) ---------------------------------------------------------


def test_autocommit_off_on_the_database_leasing_writes_through_is_e014(settings, monkeypatch):
    assert messages("leasing.E014") == []
    monkeypatch.setitem(settings.DATABASES["default"], "AUTOCOMMIT", False)
    [message] = messages("leasing.E014")
    assert "DATABASES['default'] sets AUTOCOMMIT = False" in message


# --- 3. bounds of limits, weights and a handler's max_retries -----------------------------


@pytest.mark.parametrize(
    ("setting", "value", "words"),
    [
        ("FAIRNESS_WEIGHTS", 10**20, "at most 1000000"),
        ("FAIRNESS_WEIGHTS", 2**55, "at most 1000000"),
        ("QUEUE_LIMITS", 2**63, "at most 2147483647"),
        ("WORK_TYPE_LIMITS", 10**20, "at most 2147483647"),
        # More digits than Python will print (4,300): still E001, not a ValueError.
        ("QUEUE_LIMITS", 10**5000, "at most 2147483647, got an int too large to show"),
        ("FAIRNESS_WEIGHTS", -(10**5000), "a positive integer, got an int too large to show"),
    ],
    ids=lambda v: v if isinstance(v, str) else f"{v.bit_length()} bits",
)
def test_a_limit_or_weight_beyond_what_the_claim_holds_is_e001(settings, setting, value, words):
    settings.LEASING = {**settings.LEASING, setting: {"t1": value, "ok": 3}}
    [message] = messages("leasing.E001")
    assert f"LEASING[{setting!r}]['t1']" in message and words in message


def test_the_largest_limits_and_weight_are_valid(settings):
    settings.LEASING = {
        **settings.LEASING,
        "FAIRNESS_WEIGHTS": {"t1": 1_000_000},
        "QUEUE_LIMITS": {"q": 2**31 - 1},
        "WORK_TYPE_LIMITS": {"t": 2**31 - 1},
    }
    assert messages("leasing.E001") == []


def test_a_handlers_max_retries_beyond_the_column_is_e010(handlers_setting):
    handlers_setting({"t": {"handler": NOOP, "max_retries": 2**31}})
    [message] = messages("leasing.E010")
    assert "t: max_retries" in message and "2147483647" in message
    with pytest.raises(LeasingConfigurationError, match="max_retries"):
        registry.register("x", noop, max_retries=2**31)  # the decorator's path too
    assert registry.register("x", noop, max_retries=2**31 - 1).max_retries == 2**31 - 1


# --- 4. a sweep interval django-q2 cannot schedule ----------------------------------------


def test_a_sweep_interval_beyond_a_django_q_schedule_is_refused_in_one_line():
    assert schedule_minutes(32767 * 60) == 32767
    with pytest.raises(InvalidInput, match="at most 32767 minutes"):
        schedule_minutes(32767 * 60 + 1)


# --- 5. a stop grace multiprocessing cannot wait ------------------------------------------


def test_stopping_a_child_with_a_grace_of_weeks_does_not_overflow():
    child = Child(name="c", using="default", max_items=1, max_memory_mb=1)
    process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    process.start()
    child.process = process
    child.stop(3_000_000.0)  # a PROCESS_STOP_GRACE of about five weeks
    assert not process.is_alive()


# --- 6. a metrics token no request can present --------------------------------------------


@pytest.mark.parametrize("token", [" secret", "secret\n", "secret\t", "s\x01cret"])
def test_a_metrics_token_no_request_can_present_is_e001(settings, token):
    settings.LEASING = {**settings.LEASING, "METRICS_TOKEN": token}
    [message] = messages("leasing.E001")
    assert "METRICS_TOKEN" in message and token not in message  # the secret is not shown


@pytest.mark.parametrize("token", ["a b-C_9==", "sécret"])
def test_a_metrics_token_with_inner_spaces_or_non_ascii_is_valid(settings, token):
    """A non-ASCII token arrives through WSGI as latin-1 text; the view reads it back."""
    settings.LEASING = {**settings.LEASING, "METRICS_TOKEN": token}
    assert messages("leasing.E001") == []


# --- 7. what crashed the check ------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "source", "words"),
    [
        ("raises_value_error", "raise ValueError('no config')\n", "no config"),
        ("bad_syntax", "def f(:\n", "invalid syntax"),
    ],
)
def test_a_handlers_module_that_raises_as_it_loads_is_e010(
    handlers_setting, tmp_path, monkeypatch, module, source, words
):
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    handlers_setting({"x": f"{module}.f"})
    [message] = messages("leasing.E010")
    assert "LEASING['HANDLERS']['x']" in message and words in message


@pytest.mark.parametrize(
    ("value", "level"),
    [("debug", logging.DEBUG), (" INFO", logging.INFO), ("Warning", logging.WARNING), ("10", 10)],
)
def test_the_log_level_variable_is_read_case_insensitively(monkeypatch, value, level):
    monkeypatch.setenv("LEASING_LOG_LEVEL", value)
    logging_config = runpy.run_path(str(PROJECT_SETTINGS))["LOGGING"]
    configured = logging_config["loggers"]["leasing"]["level"]
    assert logging._checkLevel(configured) == level  # what dictConfig() does with it


def test_an_unknown_log_level_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("LEASING_LOG_LEVEL", "loud")
    with pytest.raises(Exception, match="LEASING_LOG_LEVEL must be one of DEBUG, INFO"):
        runpy.run_path(str(PROJECT_SETTINGS))
