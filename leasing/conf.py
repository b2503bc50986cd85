"""Typed settings for the leasing app, read lazily from `settings.LEASING`.

    from leasing.conf import leasing_settings
    leasing_settings.lease_duration  # 300.0 unless LEASING["LEASE_DURATION"] says otherwise

Nothing is read at import time: the first attribute access builds a frozen
`LeasingSettings` from `settings.LEASING` (validated, unknown keys rejected) and
caches it until Django's `setting_changed` signal says `LEASING` changed.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass, field
from typing import Any

from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS
from django.dispatch import receiver

from .exceptions import InvalidInput, LeasingConfigurationError
from .ticks import ScheduleSpec, parse_schedule

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class LeasingSettings:
    # Leases
    lease_duration: float = 300.0
    heartbeat_interval: float = 30.0
    heartbeat_max_failures: int = 3
    max_retries: int = 3
    retry_backoff_base: float = 2.0
    retry_backoff_max: float = 3600.0
    retry_jitter: float = 0.25

    # Recovery sweep
    sweep_interval: float = 60.0
    sweep_batch_size: int = 2000
    checkpoint_retention: int = 100

    # Dashboard
    stale_heartbeat: float = 120.0

    # Idempotency keys
    idempotency_ttl: float = 24 * 3600.0

    # Proof-of-work lease extender
    extender_interval: float = 60.0
    extender_extension: float = 300.0
    extender_enabled: bool = True

    # Bad input
    max_payload_bytes: int = MIB

    # The most a lease can live from its claim, whatever its renewals (per-type
    # `max_lease_lifetime` and `timeout` handler options can lower it).
    max_lease_lifetime: float = 4 * 3600.0

    # Worker runtime
    poll_interval: float = 1.0
    shutdown_timeout: float = 30.0
    handlers: dict[str, Any] = field(default_factory=dict)
    # Producer-only processes may enqueue work types they have no handler for.
    allow_unregistered_types: bool = False
    # Idle PostgreSQL workers wait for NOTIFY on a session connection of
    # `listen_database` (default: the worker's own database). Behind a
    # transaction pooler name a direct connection, or set LISTEN to False to poll.
    listen: bool = True
    listen_database: str | None = None

    # The console's reads (dashboard, lists and item pages, timeline, history,
    # /metrics) go to this database alias, e.g. a streaming replica; None: the
    # default database. Lease writes, and every read that decides one (an
    # operator action's re-read), always go to the default database.
    read_database: str | None = None

    # Metrics endpoint: a bearer token, or None for staff sessions only.
    metrics_token: str | None = None

    # Periodic work (README "Schedules"): name -> validated ScheduleSpec.
    schedules: dict[str, ScheduleSpec] = field(default_factory=dict)
    # Global concurrency limits: at most N items in flight (claimed, not yet
    # finished) per queue / per work type, across every worker and host.
    queue_limits: dict[str, int] = field(default_factory=dict)
    work_type_limits: dict[str, int] = field(default_factory=dict)


_POSITIVE_NUMBERS = {
    "lease_duration",
    "heartbeat_interval",
    "retry_backoff_base",
    "retry_backoff_max",
    "sweep_interval",
    "stale_heartbeat",
    "idempotency_ttl",
    "extender_interval",
    "extender_extension",
    "poll_interval",
    "shutdown_timeout",
    "max_lease_lifetime",
}
_POSITIVE_INTEGERS = {
    "heartbeat_max_failures",
    "sweep_batch_size",
    "checkpoint_retention",
    "max_payload_bytes",
}
_NON_NEGATIVE_INTEGERS = {"max_retries"}


def _check_value(name: str, value: Any) -> Any:
    key = f"LEASING[{name.upper()!r}]"
    if name in _POSITIVE_NUMBERS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LeasingConfigurationError(f"{key} must be a number, got {value!r}.")
        if not math.isfinite(value) or value <= 0:
            raise LeasingConfigurationError(f"{key} must be a positive number, got {value!r}.")
        return float(value)
    if name in _POSITIVE_INTEGERS | _NON_NEGATIVE_INTEGERS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise LeasingConfigurationError(f"{key} must be an integer, got {value!r}.")
        minimum = 0 if name in _NON_NEGATIVE_INTEGERS else 1
        if value < minimum:
            raise LeasingConfigurationError(f"{key} must be at least {minimum}, got {value!r}.")
        return value
    if name == "retry_jitter":
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise LeasingConfigurationError(f"{key} must be a number in [0, 1), got {value!r}.")
        return float(value)
    if name in ("extender_enabled", "allow_unregistered_types", "listen"):
        if not isinstance(value, bool):
            raise LeasingConfigurationError(f"{key} must be True or False, got {value!r}.")
        return value
    if name == "handlers":
        if not isinstance(value, dict):
            raise LeasingConfigurationError(
                f"{key} must be a dict of work type to handler, got {type(value).__name__}."
            )
        return dict(value)
    if name in ("listen_database", "read_database"):
        if value is not None and (not isinstance(value, str) or not value):
            raise LeasingConfigurationError(f"{key} must be a database alias or None.")
        return value
    if name in ("queue_limits", "work_type_limits"):
        return _check_limits(key, value)
    if name == "metrics_token":
        if value is not None and (not isinstance(value, str) or not value):
            raise LeasingConfigurationError(f"{key} must be a non-empty string or None.")
        return value
    if name == "schedules":
        return parse_schedules(value)
    raise AssertionError(f"no validator for {name}")  # pragma: no cover


class ScheduleConfigurationError(LeasingConfigurationError):
    """A bad `LEASING["SCHEDULES"]` entry (system check leasing.E006)."""


def parse_schedules(value: Any) -> dict[str, ScheduleSpec]:
    """`LEASING["SCHEDULES"]`: a dict of name to definition, each one validated."""
    if not isinstance(value, dict):
        raise ScheduleConfigurationError(
            f"LEASING['SCHEDULES'] must be a dict of name to schedule, got {type(value).__name__}."
        )
    specs = {}
    for name, definition in value.items():
        try:
            spec = parse_schedule(name, definition)
        except InvalidInput as exc:
            raise ScheduleConfigurationError(f"LEASING['SCHEDULES']: {exc}") from None
        specs[spec.name] = spec
    return specs


def _check_limits(key: str, value: Any) -> dict[str, int]:
    """A dict of non-empty names to positive integers (the most in flight at once)."""
    if not isinstance(value, dict):
        raise LeasingConfigurationError(
            f"{key} must be a dict of name to a positive integer, got {type(value).__name__}."
        )
    limits: dict[str, int] = {}
    for name, limit in value.items():
        if not isinstance(name, str) or not name.strip():
            raise LeasingConfigurationError(f"{key} keys must be non-empty strings, got {name!r}.")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise LeasingConfigurationError(
                f"{key}[{name!r}] must be a positive integer, got {limit!r}."
            )
        limits[name] = limit
    return limits


def build_settings(overrides: dict[str, Any] | None) -> LeasingSettings:
    """Validate `settings.LEASING` and return the typed settings."""
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        raise LeasingConfigurationError(
            f"settings.LEASING must be a dict, got {type(overrides).__name__}."
        )
    known = {f.name for f in dataclasses.fields(LeasingSettings)}
    values: dict[str, Any] = {}
    for raw_key, value in overrides.items():
        name = str(raw_key).lower()
        if name not in known:
            choices = ", ".join(sorted(n.upper() for n in known))
            raise LeasingConfigurationError(
                f"Unknown setting LEASING[{raw_key!r}]. Known settings: {choices}."
            )
        values[name] = _check_value(name, value)
    return LeasingSettings(**values)


class _LazySettings:
    """Proxy that builds `LeasingSettings` on first use and after `LEASING` changes."""

    def __init__(self) -> None:
        self._cached: LeasingSettings | None = None
        self._lock = threading.Lock()

    def _load(self) -> LeasingSettings:
        cached = self._cached
        if cached is None:
            from django.conf import settings

            with self._lock:
                cached = self._cached = build_settings(getattr(settings, "LEASING", None))
        return cached

    def __getattr__(self, name: str) -> Any:
        return getattr(self._load(), name)

    @property
    def current(self) -> LeasingSettings:
        return self._load()

    def reload(self) -> None:
        self._cached = None


leasing_settings = _LazySettings()


@receiver(setting_changed)
def _reload_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting == "LEASING":
        leasing_settings.reload()


def get_settings() -> LeasingSettings:
    """The current typed settings (read lazily, cached)."""
    return leasing_settings.current


# Every lease write, and every read that decides one, goes to this alias.
WRITE_DATABASE = DEFAULT_DB_ALIAS


def read_alias() -> str:
    """The alias the console reads from: `LEASING["READ_DATABASE"]`, else the default database.

    The one place the console, the admin querysets and `/metrics` learn where to
    read; an operator action re-reads on `WRITE_DATABASE` before it writes.
    """
    return leasing_settings.read_database or WRITE_DATABASE


def reads_from_replica() -> bool:
    """True when the console reads from another alias than the one leases are written to."""
    return read_alias() != WRITE_DATABASE
