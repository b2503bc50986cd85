"""The settings made of entries: QUEUE_LIMITS, WORK_TYPE_LIMITS and SCHEDULES.

Each entry is read on its own: a bad one is a `SettingProblem` with
`entry=True`, the others are kept. `manage.py check` reports every problem
(leasing.E001 for a limit, E006 for a schedule); a process that runs anyway
logs each once and skips it (`leasing.conf`), so one bad limit or schedule
never stops the other queues and schedules. The rules are the runtime's
(`leasing.validation`, `leasing.ticks.parse_schedule`), not a copy of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Modules, not their names: `validation` imports `conf`, which imports this module.
from . import ticks, validation
from .exceptions import InvalidInput, LeasingConfigurationError

if TYPE_CHECKING:
    from .ticks import ScheduleSpec


@dataclass(frozen=True, slots=True)
class SettingProblem:
    """One thing wrong in `settings.LEASING` (`read_settings`).

    `entry`: one entry of QUEUE_LIMITS, WORK_TYPE_LIMITS or SCHEDULES (or the
    whole setting when it is not a dict); at run time it is logged once and
    skipped, and the rest of the settings apply. Any other problem makes the
    settings unusable: every use of them raises it.
    """

    setting: str  # the key of LEASING, upper case ("QUEUE_LIMITS")
    message: str
    entry: bool = False

    def error(self) -> LeasingConfigurationError:
        if self.setting == "SCHEDULES":
            return ScheduleConfigurationError(self.message)
        return LeasingConfigurationError(self.message)


class ScheduleConfigurationError(LeasingConfigurationError):
    """A bad `LEASING["SCHEDULES"]` entry (system check leasing.E006)."""


def read_schedules(
    value: Any, *, max_payload_bytes: int | None = None
) -> tuple[dict[str, ScheduleSpec], list[SettingProblem]]:
    """`LEASING["SCHEDULES"]`: the valid schedules, and a problem for each bad one."""
    if not isinstance(value, dict):
        message = (
            f"LEASING['SCHEDULES'] must be a dict of name to schedule, got {type(value).__name__}."
        )
        return {}, [SettingProblem("SCHEDULES", message, entry=True)]
    specs: dict[str, ScheduleSpec] = {}
    problems = []
    for name, definition in value.items():
        try:
            spec = ticks.parse_schedule(name, definition, max_payload_bytes=max_payload_bytes)
        except InvalidInput as exc:
            problems.append(SettingProblem("SCHEDULES", f"LEASING['SCHEDULES']: {exc}", entry=True))
            continue
        specs[spec.name] = spec
    return specs, problems


def read_limits(setting: str, value: Any) -> tuple[dict[str, int], list[SettingProblem]]:
    """QUEUE_LIMITS or WORK_TYPE_LIMITS: the valid limits, and a problem for each bad one.

    A limit's name must be what a queue or work type can be (non-empty
    storable text of at most 255 characters): the claim sends it to the
    database, where a NUL or a lone surrogate fails the statement.
    """
    key = f"LEASING[{setting!r}]"
    if not isinstance(value, dict):
        message = f"{key} must be a dict of name to a positive integer, got {type(value).__name__}."
        return {}, [SettingProblem(setting, message, entry=True)]
    limits: dict[str, int] = {}
    problems = []
    for name, limit in value.items():
        if not isinstance(name, str) or not name.strip():
            message = f"{key} keys must be non-empty strings, got {name!r}."
        elif isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            message = f"{key}[{name!r}] must be a positive integer, got {limit!r}."
        else:
            try:
                limits[validation.non_empty_text(f"{key} key {name!r}", name)] = limit
                continue
            except InvalidInput as exc:
                message = str(exc)
        problems.append(SettingProblem(setting, message, entry=True))
    return limits, problems
