"""Process execution's options and settings: what the handler option, `runworker
--execution` and the PROCESS_* settings accept, and what the system check says."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from leasing.checks import check_settings
from leasing.conf import read_settings
from leasing.exceptions import InvalidInput, LeasingConfigurationError
from leasing.handlers import build_spec, registry
from leasing.worker.options import WorkerOptions, resolve
from tests.testapp.handlers import noop


def e011() -> list[str]:
    return [m.msg for m in check_settings() if m.id == "leasing.E011"]


def test_the_handler_option_takes_thread_process_or_none():
    assert build_spec("t", noop).execution is None
    assert build_spec("t", noop, execution="process").execution == "process"
    with pytest.raises(LeasingConfigurationError, match="execution must be"):
        build_spec("t", noop, execution="fork")


def test_a_handlers_own_choice_beats_the_workers():
    registry.register("t.in_child", noop, execution="process")
    try:
        config = resolve(WorkerOptions(work_types=("test.noop", "t.in_child")))
    finally:
        registry.unregister("t.in_child")
    assert dict(config.executions) == {"test.noop": "thread", "t.in_child": "process"}
    config = resolve(WorkerOptions(work_types=("test.noop",), execution="process"))
    assert dict(config.executions) == {"test.noop": "process"}
    with pytest.raises(InvalidInput, match="execution must be"):
        resolve(WorkerOptions(work_types=("test.noop",), execution="fork"))


def test_runworker_refuses_an_unknown_execution():
    with pytest.raises(CommandError, match="invalid choice: 'fork'"):
        call_command("runworker", "--execution", "fork")


def test_bad_process_settings_are_e001():
    _, problems = read_settings(
        {"PROCESS_MAX_ITEMS": 0, "PROCESS_MAX_MEMORY_MB": "big", "PROCESS_STOP_GRACE": -1}
    )
    assert sorted(p.setting for p in problems) == [
        "PROCESS_MAX_ITEMS",
        "PROCESS_MAX_MEMORY_MB",
        "PROCESS_STOP_GRACE",
    ]


def test_a_stop_grace_not_below_the_shutdown_timeout_is_w006_where_children_run(settings):
    def w006() -> list[str]:
        return [m.msg for m in check_settings() if m.id == "leasing.W006"]

    settings.LEASING = {**settings.LEASING, "PROCESS_STOP_GRACE": 30, "SHUTDOWN_TIMEOUT": 30}
    assert w006() == []  # no handler runs in a child: nothing to wait for
    registry.register("t.in_child", noop, execution="process")
    try:
        [message] = w006()
        settings.LEASING = {**settings.LEASING, "PROCESS_STOP_GRACE": 5}
        assert w006() == []
    finally:
        registry.unregister("t.in_child")
    assert "PROCESS_STOP_GRACE" in message and "SHUTDOWN_TIMEOUT" in message


def test_a_process_handler_a_child_cannot_import_is_e011():
    def local_handler(ctx: object) -> None:
        return None

    registry.register("t.local", local_handler, execution="process")
    try:
        [message] = e011()
    finally:
        registry.unregister("t.local")
    assert "'t.local'" in message and "local_handler" in message
    # The same function in thread mode needs no import: the worker holds it.
    registry.register("t.local", local_handler)
    try:
        assert e011() == []
    finally:
        registry.unregister("t.local")
