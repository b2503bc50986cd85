"""The settings made of entries: QUEUE_LIMITS, WORK_TYPE_LIMITS, SCHEDULES, RATE_LIMITS,
FAIR_QUEUES and FAIRNESS_WEIGHTS.

Each entry is read on its own: a bad one is a `SettingProblem` with
`entry=True`, the others are kept. `manage.py check` reports every problem
(leasing.E001 for a limit or a fair queue, E006 for a schedule, E012 for a rate
limit); a process that runs anyway
logs each once and skips it (`leasing.conf`), so one bad limit or schedule
never stops the other queues and schedules. The rules are the runtime's
(`leasing.validation`, `leasing.ticks.parse_schedule`), not a copy of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Modules, not their names: `validation` imports `conf`, which imports this module.
from . import rates, ticks, validation
from .exceptions import InvalidInput, LeasingConfigurationError

if TYPE_CHECKING:
    from .rates import RateLimit
    from .ticks import ScheduleSpec


@dataclass(frozen=True, slots=True)
class SettingProblem:
    """One thing wrong in `settings.LEASING` (`read_settings`).

    `entry`: one entry of QUEUE_LIMITS, WORK_TYPE_LIMITS or SCHEDULES (or the
    whole setting when it is not a dict); at run time it is logged once and
    skipped, and the rest of the settings apply. Any other problem makes the
    settings unusable: every use of them raises it.

    `spelt_twice` (an `entry` problem too): LEASING holds the setting under keys
    that differ only in case; at run time it is logged once and the last
    spelling applies (`conf.read_settings`).
    """

    setting: str  # the key of LEASING, upper case ("QUEUE_LIMITS")
    message: str
    entry: bool = False
    spelt_twice: bool = False

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


# The largest limit or weight each such setting takes. The claim sends them to the
# database as parameters and does arithmetic on them: a limit beyond an int4 overflows
# SQLite's integers or PostgreSQL's bigint in the claim, and a weight multiplies a share
# of the claim (`sql/fairness.py`). A million turns per round is far above any real ratio.
# PostgreSQL's integer, as validation.PG_INT_MAX (not read from there: validation
# imports conf, which imports this module, so it is not defined yet at this point).
MAX_LIMIT = 2**31 - 1
MAX_FAIRNESS_WEIGHT = 1_000_000
_MAXIMUM = {
    "QUEUE_LIMITS": MAX_LIMIT,
    "WORK_TYPE_LIMITS": MAX_LIMIT,
    "FAIRNESS_WEIGHTS": MAX_FAIRNESS_WEIGHT,
}


def read_limits(setting: str, value: Any) -> tuple[dict[str, int], list[SettingProblem]]:
    """QUEUE_LIMITS, WORK_TYPE_LIMITS or FAIRNESS_WEIGHTS: the valid limits, and a problem
    for each bad one.

    A limit's name must be what a queue or work type can be (non-empty
    storable text of at most 255 characters): the claim sends it to the
    database, where a NUL or a lone surrogate fails the statement. Its value is a
    positive integer of at most `_MAXIMUM[setting]`.
    """
    key = f"LEASING[{setting!r}]"
    maximum = _MAXIMUM.get(setting, MAX_LIMIT)
    if not isinstance(value, dict):
        message = f"{key} must be a dict of name to a positive integer, got {type(value).__name__}."
        return {}, [SettingProblem(setting, message, entry=True)]
    limits: dict[str, int] = {}
    problems = []
    for name, limit in value.items():
        if not isinstance(name, str) or not name.strip():
            message = f"{key} keys must be non-empty strings, got {validation._short(name)}."
        elif isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            message = f"{key}[{name!r}] must be a positive integer, got {validation._short(limit)}."
        elif limit > maximum:
            message = f"{key}[{name!r}] must be at most {maximum}, got {validation._short(limit)}."
        else:
            try:
                limits[validation.non_empty_text(f"{key} key {name!r}", name)] = limit
                continue
            except InvalidInput as exc:
                message = str(exc)
        problems.append(SettingProblem(setting, message, entry=True))
    return limits, problems


def read_rate_limits(value: Any) -> tuple[dict[str, RateLimit | None], list[SettingProblem]]:
    """`LEASING["RATE_LIMITS"]`: the valid limits by bucket, and a problem for each bad one.

    A key is `queue:<name>`, `work_type:<name>`, `key:<rate key>` or `key:*`
    (every rate key without a limit of its own); `key:*` may be None: rate
    keys have no default limit, but an enqueue's `rate_limit` holds.
    """
    setting = "RATE_LIMITS"
    if not isinstance(value, dict):
        message = (
            f"LEASING['RATE_LIMITS'] must be a dict of 'queue:<name>', 'work_type:<name>' or "
            f"'key:<rate key>' to a rate like '50/s', got {type(value).__name__}."
        )
        return {}, [SettingProblem(setting, message, entry=True)]
    limits: dict[str, RateLimit | None] = {}
    problems = []
    for bucket, limit in value.items():
        key = f"LEASING['RATE_LIMITS'][{bucket!r}]"
        kind, _, name = bucket.partition(":") if isinstance(bucket, str) else ("", "", "")
        try:
            if kind not in rates.KINDS or not name:
                raise InvalidInput(
                    f"{key}: a key must be 'queue:<name>', 'work_type:<name>', "
                    "'key:<rate key>' or 'key:*'."
                )
            validation.non_empty_text(f"{key} name", name)
            if limit is None and bucket == rates.ANY_KEY:
                limits[bucket] = None
                continue
            limits[bucket] = rates.parse_rate_limit(key, limit)
        except InvalidInput as exc:
            problems.append(SettingProblem(setting, str(exc), entry=True))
    return limits, problems


def read_fair_queues(value: Any) -> tuple[tuple[str, ...], list[SettingProblem]]:
    """`LEASING["FAIR_QUEUES"]`: the queues whose claims take turns across fairness keys."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        message = (
            f"LEASING['FAIR_QUEUES'] must be a list of queue names, got {validation._short(value)}."
        )
        return (), [SettingProblem("FAIR_QUEUES", message, entry=True)]
    queues: list[str] = []
    problems = []
    for name in value:
        try:
            queues.append(validation.non_empty_text("LEASING['FAIR_QUEUES'] entry", name))
        except InvalidInput as exc:
            problems.append(SettingProblem("FAIR_QUEUES", str(exc), entry=True))
    return tuple(sorted(set(queues))), problems
