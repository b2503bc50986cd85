"""When a schedule ticks: cron expressions in a time zone, or a fixed interval.

Pure functions, no database: `Timing` says when a schedule's ticks fall and
`Timing.due(next_run_at, now)` what one pass of the scheduler owes at `now`.
The settings (`conf.py`), the admin form and the scheduler service all
validate through `parse_timing()`, so they refuse the same input with the
same words.

* A cron expression (5 fields, or 6 with seconds first) is read by `cronsim`
  in the schedule's time zone, with Debian cron's daylight-saving rules: a
  wall time skipped when the clocks go forward runs when they do (02:30 on
  the spring-forward night runs at 03:00), one repeated when they go back runs
  once (its first occurrence).
* An interval (`every` seconds) ticks at whole multiples of it since the Unix
  epoch (UTC), so every scheduler agrees on the ticks without any state; the
  time zone does not move interval ticks.

Ticks are computed in Python because no SQL dialect evaluates cron in a time
zone; the scheduler feeds them one reading of the database clock per pass
(`leasing.services.schedules`), and what decides that a tick runs once is a
compare-and-swap on `next_run_at` in the database, not the clock.

cronsim is in the `schedule` extra; it is imported only when a cron
expression is parsed, so interval schedules work without it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from . import validation
from .exceptions import InvalidInput

if TYPE_CHECKING:
    from cronsim import CronSim

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# How many missed cron ticks a pass counts before it stops counting (a
# schedule every second that was off for a week would otherwise walk 600,000
# ticks): the item then says "at least" this many.
MAX_COUNTED_TICKS = 10_000
MISSED_POLICIES = ("skip", "catch_up")
# The widths of the `schedules` columns (leasing.models.schedules): a longer value
# would fail the scheduler's sync in the database instead of here.
MAX_CRON_LENGTH = 255
MAX_TIMEZONE_LENGTH = 64
CRONSIM_MISSING = (
    "cron schedules need the cronsim package: pip install 'django-leasing[schedule]' "
    "(or use 'every' seconds instead of 'cron')"
)


@dataclass(frozen=True, slots=True)
class Due:
    """What a pass owes one schedule at `now` (see `Timing.due`)."""

    tick: datetime  # the most recent tick at or before now: the item's tick
    first: datetime  # the oldest tick not yet run (== tick when none was missed)
    ticks: int  # ticks from `first` to `tick`, both included (capped at MAX_COUNTED_TICKS)
    next_run_at: datetime  # the first tick after now

    @property
    def missed(self) -> int:
        """Ticks that came due before `tick` and never ran."""
        return self.ticks - 1


@dataclass(frozen=True, slots=True)
class Timing:
    cron: str | None
    every: int | None
    timezone: str

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron!r} ({self.timezone})"
        return f"every {self.every}s"

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after `moment` (aware), in UTC."""
        if self.every is not None:
            step = timedelta(seconds=self.every)
            return EPOCH + ((moment - EPOCH) // step + 1) * step
        local = moment.astimezone(self.zone)
        return next(self._cron_ticks(local)).astimezone(UTC)

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last tick at or before `moment` (aware), in UTC."""
        if self.every is not None:
            step = timedelta(seconds=self.every)
            return EPOCH + ((moment - EPOCH) // step) * step
        # cronsim's reverse walk includes the start's whole second when the
        # start has microseconds, so a tick exactly at `moment` counts. The
        # arithmetic is done in UTC: adding to a local time drops its `fold`,
        # which would move a moment of the hour repeated when the clocks go
        # back to its first occurrence, an hour earlier.
        start = moment.astimezone(UTC).replace(microsecond=0) + timedelta(microseconds=1)
        return next(self._cron_ticks(start.astimezone(self.zone), reverse=True)).astimezone(UTC)

    def due(self, next_run_at: datetime, now: datetime) -> Due | None:
        """What is owed at `now` to a schedule whose next tick is `next_run_at`.

        None when nothing is due yet. Otherwise one item is owed, for the most
        recent tick at or before `now`; `first` and `ticks` say which ticks
        since `next_run_at` it stands for (the missed-tick policy decides
        what the item is told, not how many items there are).
        """
        if next_run_at > now:
            return None
        latest = max(self.latest_at_or_before(now), next_run_at)
        return Due(
            tick=latest,
            first=next_run_at,
            ticks=self._count(next_run_at, latest),
            next_run_at=self.next_after(now),
        )

    def _count(self, first: datetime, last: datetime) -> int:
        if first >= last:
            return 1
        if self.every is not None:
            return min(int((last - first) // timedelta(seconds=self.every)) + 1, MAX_COUNTED_TICKS)
        count, local = 1, first.astimezone(self.zone)
        for tick in self._cron_ticks(local):
            if tick.astimezone(UTC) > last or count >= MAX_COUNTED_TICKS:
                break
            count += 1
        return count

    def _cron_ticks(self, start: datetime, *, reverse: bool = False) -> CronSim:
        """The cron expression's ticks from `start` (local time), forward or back."""
        assert self.cron is not None  # a timing has a cron expression when it has no `every`
        return _cronsim()(self.cron, start, reverse=reverse)


def _cronsim() -> type[CronSim]:
    try:
        from cronsim import CronSim
    except ImportError:
        raise InvalidInput(CRONSIM_MISSING + ".") from None
    return CronSim


def parse_timezone(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TIMEZONE_LENGTH:
        raise InvalidInput(f"timezone must be an IANA time zone name, got {value!r}.")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(
            f"unknown time zone {value!r}; use an IANA name such as 'Europe/Paris' or 'UTC'."
        ) from None
    return value


def parse_cron(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or not _storable(value):
        raise InvalidInput(f"cron must be a cron expression such as '0 3 * * *', got {value!r}.")
    expression = " ".join(value.split())
    if len(expression) > MAX_CRON_LENGTH:
        raise InvalidInput(
            f"cron expression must be at most {MAX_CRON_LENGTH} characters, got {len(expression)}."
        )
    if len(expression.split()) not in (5, 6):
        raise InvalidInput(
            f"cron expression {value!r} must have 5 fields (minute hour day month weekday) "
            "or 6 (seconds first)."
        )
    CronSim = _cronsim()
    from cronsim import CronSimError

    try:
        CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise InvalidInput(f"invalid cron expression {value!r}: {exc}.") from None
    return expression


def parse_every(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInput(f"every must be a positive whole number of seconds, got {value!r}.")
    if value > 366 * 86400:
        raise InvalidInput(f"every must be at most a year of seconds, got {value!r}.")
    return value


def parse_timing(cron: Any, every: Any, timezone: Any = "UTC") -> Timing:
    """Validated timing: exactly one of `cron` and `every`, and a known time zone."""
    if (cron is None or cron == "") == (every is None):
        raise InvalidInput("a schedule needs exactly one of 'cron' and 'every'.")
    zone = parse_timezone(timezone)
    if every is not None:
        return Timing(cron=None, every=parse_every(every), timezone=zone)
    return Timing(cron=parse_cron(cron), every=None, timezone=zone)


def parse_missed(value: Any) -> str:
    if value not in MISSED_POLICIES:
        raise InvalidInput(f"missed must be 'skip' or 'catch_up', got {value!r}.")
    return str(value)


SCHEDULE_KEYS = frozenset({"work_type", "cron", "every", "timezone", "payload", "queue", "missed"})
RESERVED_PAYLOAD_KEY = "_schedule"
MAX_NAME_LENGTH = 100


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """One validated schedule (from `LEASING["SCHEDULES"]` or the admin form)."""

    name: str
    work_type: str
    timing: Timing
    payload: dict[str, Any]
    queue: str = "default"
    missed: str = "skip"

    @property
    def fingerprint(self) -> str:
        """Changes whenever the definition does: the settings sync rewrites a row then."""
        text = json.dumps(
            [
                self.work_type,
                self.timing.cron,
                self.timing.every,
                self.timing.timezone,
                self.payload,
                self.queue,
                self.missed,
            ],
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def _storable(value: str) -> bool:
    """No NUL and no lone surrogate: text both databases store (`validation.storable_text`)."""
    try:
        validation.storable_text("text", value)
    except InvalidInput:
        return False
    return True


def parse_name(value: Any) -> str:
    if (
        not isinstance(value, str)
        or not value.strip()
        or len(value) > MAX_NAME_LENGTH
        or not _storable(value)
    ):
        raise InvalidInput(
            f"a schedule name must be non-empty text of at most {MAX_NAME_LENGTH} characters, "
            f"without NUL or lone surrogate characters, got {value!r}."
        )
    return value


def parse_payload(value: Any, *, limit: int | None = None) -> dict[str, Any]:
    """A payload every database stores (`validation.payload`: NUL, surrogates, size, depth).

    Returned as it will be stored: decoded from its JSON (keys become
    strings, tuples lists), so the fingerprint and the items see one value.
    `limit`: the byte limit (None: `LEASING["MAX_PAYLOAD_BYTES"]`).
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"payload must be a JSON object (a dict), got {type(value).__name__}.")
    if RESERVED_PAYLOAD_KEY in value:
        raise InvalidInput(
            f"payload must not use the key {RESERVED_PAYLOAD_KEY!r}: each item gets its tick there."
        )
    encoded = validation.payload("payload", value, limit=limit)
    assert encoded is not None  # value is a dict
    payload: dict[str, Any] = json.loads(encoded)
    return payload


def parse_text(field: str, value: Any) -> str:
    if (
        not isinstance(value, str)
        or not value.strip()
        or len(value) > validation.MAX_KEY_LENGTH
        or not _storable(value)
    ):
        raise InvalidInput(
            f"{field} must be non-empty text of at most {validation.MAX_KEY_LENGTH} characters, "
            f"without NUL or lone surrogate characters, got {value!r}."
        )
    return value


def tick_input(name: str, payload: dict[str, Any], missed: str, due: Due) -> dict[str, Any]:
    """A tick's item input: the schedule's payload plus `_schedule`, what the tick is."""
    about: dict[str, Any] = {"name": name, "tick": due.tick.isoformat(), "missed": missed}
    if missed == "catch_up":
        about.update(since=due.first.isoformat(), ticks=due.ticks)
    else:
        about["skipped"] = due.missed
    return {**payload, RESERVED_PAYLOAD_KEY: about}


# The largest `_schedule` entry a tick can get (the longest times, the most ticks).
_LAST_MOMENT = datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
_LARGEST_DUE = Due(_LAST_MOMENT, _LAST_MOMENT, MAX_COUNTED_TICKS, _LAST_MOMENT)


def check_item_input(spec: ScheduleSpec, *, limit: int | None = None) -> None:
    """Refuse a schedule whose ticks' items the enqueue would refuse (too large with their
    `_schedule` entry), so that it is refused once, here, rather than at every tick."""
    validation.payload(
        f"payload (with the {RESERVED_PAYLOAD_KEY!r} entry each tick's item gets)",
        tick_input(spec.name, spec.payload, spec.missed, _LARGEST_DUE),
        limit=limit,
    )


def parse_schedule(
    name: Any, definition: Any, *, max_payload_bytes: int | None = None
) -> ScheduleSpec:
    """One `LEASING["SCHEDULES"]` entry, validated (InvalidInput says what is wrong).

    Every rule the scheduler and the enqueue apply at run time is checked
    here (storable text, the payload's size with its `_schedule` entry, its
    depth), so a schedule that passes never fails at its ticks for what it
    says. `max_payload_bytes`: the limit (None: `LEASING["MAX_PAYLOAD_BYTES"]`;
    the settings pass theirs while they are being read).
    """
    name = parse_name(name)
    if not isinstance(definition, dict):
        raise InvalidInput(f"schedule {name!r} must be a dict, got {type(definition).__name__}.")
    try:
        unknown = set(definition) - SCHEDULE_KEYS
        if unknown:
            raise InvalidInput(
                f"unknown keys {sorted(map(str, unknown))}; allowed: "
                f"{', '.join(sorted(SCHEDULE_KEYS))}."
            )
        if "work_type" not in definition:
            raise InvalidInput("'work_type' is required.")
        spec = ScheduleSpec(
            name=name,
            work_type=parse_text("work_type", definition["work_type"]),
            timing=parse_timing(
                definition.get("cron"), definition.get("every"), definition.get("timezone", "UTC")
            ),
            payload=parse_payload(definition.get("payload"), limit=max_payload_bytes),
            queue=parse_text("queue", definition.get("queue", "default")),
            missed=parse_missed(definition.get("missed", "skip")),
        )
        check_item_input(spec, limit=max_payload_bytes)
        return spec
    except InvalidInput as exc:
        raise InvalidInput(f"schedule {name!r}: {exc}") from None
