"""An `async def` handler is refused where it is registered, not failed at every run.

A worker calls a handler and stores what it returns: an async one only made a
coroutine, never awaited, and each of its items failed ("PayloadNotSerializable")
while `manage.py check` passed.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.checks import run_checks

import leasing
from leasing.exceptions import LeasingConfigurationError
from leasing.handlers import registry

WAY_OUT = "async_to_sync"


async def async_body(ctx: Any) -> dict[str, int]:
    return {"ok": 1}


async def async_generator(ctx: Any) -> Any:
    yield 1


class AsyncCallable:
    async def __call__(self, ctx: Any) -> None:
        return None


def sync_body(ctx: Any) -> dict[str, int]:
    return {"ok": 1}


@pytest.fixture
def cleanup():
    yield
    registry.unregister("t.async")
    registry.reset_settings()


@pytest.mark.parametrize(
    "func",
    [
        async_body,
        async_generator,
        AsyncCallable(),
        functools.partial(async_body),
        sync_to_async(sync_body),  # marked as a coroutine function
    ],
    ids=["async-def", "async-generator", "async-call", "partial", "sync_to_async"],
)
def test_the_decorator_refuses_an_async_handler_and_names_the_way_out(func, cleanup):
    with pytest.raises(LeasingConfigurationError, match=WAY_OUT) as raised:
        leasing.handler("t.async")(func)
    assert "'t.async'" in str(raised.value) and "synchronous" in str(raised.value)
    assert "t.async" not in registry


def test_a_synchronous_wrapper_of_async_code_is_accepted(cleanup):
    spec = registry.register("t.async", async_to_sync(async_body))
    assert spec.func({}) == {"ok": 1}


def test_a_handlers_setting_entry_naming_an_async_function_is_e010(settings, cleanup):
    settings.LEASING = {
        **settings.LEASING,
        "HANDLERS": {"t.async": "tests.unit.test_async_handlers.async_body"},
    }
    registry.reset_settings()
    [message] = [m for m in run_checks(tags=["leasing"]) if m.id == "leasing.E010"]
    assert "'t.async'" in message.msg and WAY_OUT in message.msg
    assert "synchronous" in (message.hint or "")
