"""Rate limits: "N per period, with a burst", parsed once from the settings or an enqueue.

A limit is written `"50/s"`, `"600/m"`, `"1000/h"`, `"5/10s"` (N per that many
seconds), or as a dict `{"limit": 50, "per": 1.0, "burst": 55}`. It is kept
with GCRA (the generic cell rate algorithm, a token bucket kept as one
timestamp): items are admitted one every `period / limit` seconds on average,
and `burst` bounds how many any window of one period admits (`burst >=
limit`). The bucket so holds `burst - limit + 1` items at once: a claim that
comes late by up to `(burst - limit) * interval` loses nothing. `burst`
defaults to `limit` plus a tenth (at least one), so workers that claim a few
milliseconds late still reach the full rate.

The state lives in `leasing_rate_buckets` (`leasing.sql.rates`); the claim
admits items under the bucket rows' locks (`leasing.services.rate_limits`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from .exceptions import InvalidInput

# The kinds of bucket a LEASING["RATE_LIMITS"] key names, as `<kind>:<name>`.
QUEUE = "queue"
WORK_TYPE = "work_type"
KEY = "key"
KINDS = (QUEUE, WORK_TYPE, KEY)
# `key:*`: the limit of every rate key that has none of its own.
ANY_KEY = "key:*"

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# ASCII digits only, and a period multiple with at least one digit ("5/.s" is not a rate).
_TEXT = re.compile(r"^\s*(\d+)\s*/\s*(\d+\.?\d*|\.\d+)?\s*([smhd])\s*$", re.ASCII)
# A period of at most a year, at least a millisecond; limits fit an int column.
MAX_PERIOD = 366 * 86400.0
MIN_PERIOD = 0.001
MAX_LIMIT = 1_000_000_000


@dataclass(frozen=True, slots=True)
class RateLimit:
    """`limit` items per `period` seconds; at most `burst` in any window of one period."""

    limit: int
    period: float
    burst: int

    @property
    def interval(self) -> float:
        """Seconds between two admissions at the steady rate (GCRA's emission interval)."""
        return self.period / self.limit

    @property
    def tolerance(self) -> float:
        """How far ahead of the clock the bucket's theoretical arrival time may run."""
        return (self.burst - self.limit) * self.interval

    def label(self) -> str:
        period = f"{self.period:g}s"
        return f"{self.limit}/{period} (burst {self.burst})"


def default_burst(limit: int) -> int:
    return limit + max(1, math.ceil(limit / 10))


def parse_rate_limit(name: str, value: Any) -> RateLimit:
    """A `RateLimit` from its text or dict form; InvalidInput names `name` and the problem."""
    if isinstance(value, RateLimit):
        return value
    if isinstance(value, str):
        match = _TEXT.match(value)
        if match is None:
            raise InvalidInput(
                f"{name} must look like '50/s', '600/m', '1000/h' or '5/10s', got {value!r}."
            )
        count, multiple, unit = match.groups()
        # Too many digits is out of range anyway, and past int()'s digit limit
        # a bare ValueError would escape.
        digits = count.lstrip("0") or "0"
        limit = int(digits) if len(digits) <= len(str(MAX_LIMIT)) else MAX_LIMIT + 1
        period = (float(multiple) if multiple else 1.0) * _UNITS[unit]
        return _checked(name, limit, period, None)
    if isinstance(value, dict):
        unknown = set(value) - {"limit", "per", "burst"}
        if unknown or "limit" not in value:
            raise InvalidInput(
                f"{name} must be a dict with 'limit', and optionally 'per' (seconds, default 1) "
                f"and 'burst', got {_shown(value)}."
            )
        return _checked(name, value["limit"], value.get("per", 1.0), value.get("burst"))
    raise InvalidInput(
        f"{name} must be a rate like '50/s' or a dict {{'limit': 50, 'per': 1, 'burst': 55}}, "
        f"got {_shown(value)}."
    )


def _checked(name: str, limit: Any, period: Any, burst: Any) -> RateLimit:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"{name}: the limit must be an integer from 1 to {MAX_LIMIT}.")
    if (
        isinstance(period, bool)
        or not isinstance(period, int | float)
        # Also refuses NaN and infinities (math.isfinite() would overflow on a huge int).
        or not MIN_PERIOD <= period <= MAX_PERIOD
    ):
        raise InvalidInput(
            f"{name}: the period must be a number of seconds from {MIN_PERIOD} to {MAX_PERIOD:g}."
        )
    if burst is None:
        burst = default_burst(limit)
    if isinstance(burst, bool) or not isinstance(burst, int) or not limit <= burst <= 2 * MAX_LIMIT:
        raise InvalidInput(
            f"{name}: the burst must be an integer from the limit ({limit}) to {2 * MAX_LIMIT}, "
            f"got {_shown(burst)}."
        )
    return RateLimit(limit, float(period), burst)


def _shown(value: Any) -> str:
    """`repr(value)` for an error message: repr() of an int of more than 4,300 digits
    (even inside a dict) raises ValueError, and of a very deep one RecursionError,
    which would replace the clear error."""
    try:
        return repr(value)
    except (ValueError, RecursionError):
        return f"a value too large to show ({type(value).__name__})"


def bucket_name(kind: str, name: str) -> str:
    return f"{kind}:{name}"


# The console's current rate counts admissions in windows of this many seconds.
WINDOW_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class BucketState:
    """What a claim writes back to a bucket: its GCRA state, what it admitted, and the
    console's windows of admissions (`window_start` in epoch seconds)."""

    tat: float
    next_at: float
    admitted: int
    window_start: float
    window_admitted: int
    previous_admitted: int


def windows_after(
    start: float, current: int, previous: int, now: float, admitted: int = 0
) -> tuple[float, int, int]:
    """The windows (start, current, previous) at `now`, with `admitted` more counted."""
    if now >= start + 2 * WINDOW_SECONDS:
        return now, admitted, 0
    if now >= start + WINDOW_SECONDS:
        return start + WINDOW_SECONDS, admitted, current
    return start, current + admitted, previous


def current_rate(start: float, current: int, previous: int, now: float) -> float:
    """Admissions per second over the last window (the previous window weighted by how
    much of it still overlaps it)."""
    start, current, previous = windows_after(start, current, previous, now)
    overlap = max(0.0, 1.0 - (now - start) / WINDOW_SECONDS)
    return (previous * overlap + current) / WINDOW_SECONDS
