"""A skewed wall clock for one process: `FAULTS_CLOCK_SKEW=600` runs it 10 minutes ahead.

The fault run's settings module calls `skew_from_environment()` before
anything else, so every wall-clock reading of the process is moved: the
`time.time()` family, `datetime.now()` / `utcnow()` / `today()` (through a
subclass put in place of `datetime.datetime`) and Django's `timezone.now()`.
Monotonic clocks are left alone, and so is the machine's clock. Leasing takes
every lease time from the database clock; a skewed process must change
nothing but the timestamps of its own logs and ids.
"""

from __future__ import annotations

import datetime as datetime_module
import os
import time

_REAL_DATETIME = datetime_module.datetime


def skew_from_environment() -> float:
    """Apply `FAULTS_CLOCK_SKEW` seconds (if set and not zero); return the skew."""
    seconds = float(os.environ.get("FAULTS_CLOCK_SKEW") or 0)
    if seconds:
        install(seconds)
    return seconds


def install(seconds: float) -> None:
    """Move this process's wall clock by `seconds` (once per process)."""
    if datetime_module.datetime is not _REAL_DATETIME:
        raise RuntimeError("the clock of this process is already skewed")
    offset = datetime_module.timedelta(seconds=seconds)
    real_time, real_time_ns = time.time, time.time_ns
    nanoseconds = round(seconds * 1e9)

    def skewed_time() -> float:
        return real_time() + seconds

    def skewed_time_ns() -> int:
        return real_time_ns() + nanoseconds

    class SkewedDateTime(_REAL_DATETIME):
        """`datetime` whose readings of now are moved by the skew."""

        @classmethod
        def now(cls, tz: datetime_module.tzinfo | None = None) -> SkewedDateTime:  # type: ignore[override]
            return _REAL_DATETIME.now(tz) + offset  # type: ignore[return-value]

        @classmethod
        def utcnow(cls) -> SkewedDateTime:  # type: ignore[override]
            return _REAL_DATETIME.now(datetime_module.UTC).replace(tzinfo=None) + offset  # type: ignore[return-value]

        @classmethod
        def today(cls) -> SkewedDateTime:  # type: ignore[override]
            return cls.now()

    time.time = skewed_time  # type: ignore[assignment]
    time.time_ns = skewed_time_ns  # type: ignore[assignment]
    datetime_module.datetime = SkewedDateTime  # type: ignore[misc]
    # Django's timezone.now() reads the name it imported at start-up.
    from django.utils import timezone

    timezone.datetime = SkewedDateTime  # type: ignore[attr-defined]
