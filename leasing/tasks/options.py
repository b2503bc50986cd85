"""The backend's OPTIONS, checked as strictly as they are used (leasing.E013).

Each problem is a message: `LeasingBackend` lists them in its system check and
refuses `enqueue()`/`get_result()` with the first. `django.task` has one
handler, registered with the LEASE_DURATION and HEARTBEAT of the first leasing
backend (`register_task_handler`, from `LeasingConfig.ready()`, never raising).
"""

from __future__ import annotations

import difflib
from typing import Any

from django.conf import settings

from .. import validation
from ..exceptions import InvalidInput, LeasingConfigurationError
from ..handlers import build_spec, registry
from .running import run_task
from .stored import BACKEND_PATH, TASK_WORK_TYPE

# The backend's OPTIONS, and those of them that configure the one `django.task` handler
# (as which of its registration options).
KNOWN_OPTIONS = ("DATABASE", "HEARTBEAT", "LEASE_DURATION", "MAX_RETRIES")
HANDLER_OPTIONS = {"LEASE_DURATION": "lease_duration", "HEARTBEAT": "heartbeat"}


def leasing_backends() -> list[tuple[str, dict[str, Any]]]:
    """The TASKS entries (alias, config) that use this backend, in settings order."""
    configs = getattr(settings, "TASKS", {})
    if not isinstance(configs, dict):
        return []
    return [
        (alias, config)
        for alias, config in configs.items()
        if isinstance(config, dict) and config.get("BACKEND") == BACKEND_PATH
    ]


def handler_options(alias: str, options: Any) -> tuple[dict[str, Any], list[str]]:
    """The `django.task` handler's registration options a backend's OPTIONS give, each
    validated as `registry.register` validates it, and the problems of the bad ones
    (left out: the handler's default applies)."""
    valid: dict[str, Any] = {}
    problems: list[str] = []
    if not isinstance(options, dict):
        return valid, problems
    for key, name in HANDLER_OPTIONS.items():
        if key not in options:
            continue
        value = options[key]
        try:
            spec = build_spec(TASK_WORK_TYPE, run_task, **{name: value})
        except LeasingConfigurationError as exc:
            problems.append(
                f"TASKS[{alias!r}]['OPTIONS'][{key!r}] is {value!r}, which the "
                f"{TASK_WORK_TYPE!r} handler refuses: {exc}"
            )
        else:
            valid[name] = getattr(spec, name)
    return valid, problems


def max_retries_option(alias: str, options: dict[str, Any]) -> tuple[int | None, list[str]]:
    """MAX_RETRIES as every enqueue takes it (each item's int4 max_retries column), and its
    problem: a value the engine refuses would fail every enqueue with InvalidInput."""
    value = options.get("MAX_RETRIES")
    if value is None:
        return None, []
    try:
        return validation.integer(
            f"TASKS[{alias!r}]['OPTIONS']['MAX_RETRIES']",
            value,
            minimum=0,
            maximum=validation.PG_INT_MAX,
        ), []
    except InvalidInput as exc:
        return None, [str(exc)]


def unknown_options(alias: str, options: dict[str, Any]) -> list[str]:
    problems = []
    for key in options:
        if key in KNOWN_OPTIONS:
            continue
        message = (
            f"Unknown option TASKS[{alias!r}]['OPTIONS'][{key!r}]. "
            f"Known options: {', '.join(KNOWN_OPTIONS)}."
        )
        close = difflib.get_close_matches(str(key).upper(), KNOWN_OPTIONS, n=1)
        if close:
            message += f" Did you mean {close[0]!r}?"
        problems.append(message)
    return problems


def handler_conflicts(alias: str, options: dict[str, Any]) -> list[str]:
    """The handler options this backend sets apart from the first leasing backend's:
    `django.task` has one handler, registered with the first's (register_task_handler).
    An option this backend leaves out is the first's, as documented."""
    backends = leasing_backends()
    if not backends or backends[0][0] == alias:
        return []
    first, config = backends[0]
    own, _ = handler_options(alias, options)  # a bad one is reported as such
    registered = build_spec(
        TASK_WORK_TYPE, run_task, **handler_options(first, config.get("OPTIONS", {}))[0]
    )
    problems = []
    for key, name in HANDLER_OPTIONS.items():
        if name not in own or own[name] == getattr(registered, name):
            continue
        problems.append(
            f"TASKS[{alias!r}]['OPTIONS'][{key!r}] is {options[key]!r}, but the first "
            f"leasing backend, TASKS[{first!r}], gives {_shown(getattr(registered, name))}: "
            f"work type {TASK_WORK_TYPE!r} has one handler, registered with the first "
            "leasing backend's LEASE_DURATION and HEARTBEAT, so this backend's tasks "
            "would not run with its own."
        )
    return problems


def _shown(value: Any) -> str:
    return "no LEASE_DURATION (the worker's lease)" if value is None else repr(value)


def register_task_handler() -> None:  # called by LeasingConfig.ready()
    """Register `run_task` for `django.task` when a TASKS backend uses leasing, with the
    LEASE_DURATION and HEARTBEAT of the first such backend.

    Never raises: a bad option is left out (the handler's default applies) and is the
    backend's leasing.E013, as is another leasing backend that sets them differently.
    """
    for alias, config in leasing_backends():
        options, _ = handler_options(alias, config.get("OPTIONS", {}))
        registry.register(TASK_WORK_TYPE, run_task, replace=True, **options)
        return


def uses_leasing_backend() -> bool:
    return bool(leasing_backends())
