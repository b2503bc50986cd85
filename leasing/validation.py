"""Argument checks shared by the services (SPEC §14).

Each check raises a specific `InvalidInput` subclass before any row is
touched, and returns the normalised value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone

from .conf import get_settings
from .exceptions import (
    InvalidDuration,
    InvalidHeartbeatInterval,
    InvalidInput,
    PayloadNotSerializable,
    PayloadTooLarge,
)

PG_INT_MIN, PG_INT_MAX = -(2**31), 2**31 - 1
# One encoder for every payload: json.dumps() with options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# Ten years: longer "durations" are typos, and make_interval() would overflow first.
MAX_SECONDS = 10 * 365 * 24 * 3600


def positive_seconds(name: str, value: Any) -> float:
    """A positive, finite number of seconds (ints and floats; not bools or strings)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidDuration(f"{name} must be a number of seconds, got {value!r}.")
    if not math.isfinite(value) or value <= 0:
        raise InvalidDuration(f"{name} must be a positive number of seconds, got {value!r}.")
    if value > MAX_SECONDS:
        raise InvalidDuration(f"{name} must be at most {MAX_SECONDS} seconds, got {value!r}.")
    return float(value)


def heartbeat_below_lease(interval: float, lease_duration: float) -> None:
    if interval >= lease_duration:
        raise InvalidHeartbeatInterval(
            f"heartbeat interval ({interval:g}s) must be below the lease duration "
            f"({lease_duration:g}s), or the lease expires before its first renewal."
        )


def integer(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer, got {value!r}.")
    if minimum is not None and value < minimum:
        raise InvalidInput(f"{name} must be at least {minimum}, got {value}.")
    if maximum is not None and value > maximum:
        raise InvalidInput(f"{name} must be at most {maximum}, got {value}.")
    return value


def non_empty_text(name: str, value: Any, *, max_length: int | None = None) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{name} must be a non-empty string, got {value!r}.")
    if "\x00" in value:
        raise InvalidInput(f"{name} must not contain NUL characters.")
    if max_length is not None and len(value) > max_length:
        raise InvalidInput(f"{name} must be at most {max_length} characters, got {len(value)}.")
    return value


def text_filter(name: str, value: Any) -> list[str] | None:
    """None, one string, or an iterable of strings: the values of an IN filter."""
    if value is None:
        return None
    if isinstance(value, str):
        return [non_empty_text(name, value)]
    if isinstance(value, Iterable):
        values = [non_empty_text(name, v) for v in value]
        if not values:
            raise InvalidInput(f"{name} must not be empty; pass None for no filter.")
        return values
    raise InvalidInput(f"{name} must be a string or a list of strings, got {value!r}.")


def payload(name: str, value: Any, *, required: bool = False) -> str | None:
    """Encode a JSON payload, enforcing serializability and the size limit.

    Returns the JSON text (None for a missing optional payload), so callers
    encode once and reuse the result.
    """
    if value is None and not required:
        return None
    try:
        encoded = _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise PayloadNotSerializable(f"{name} is not JSON-serializable: {exc}") from exc
    limit = get_settings().max_payload_bytes
    size = len(encoded.encode("utf-8"))
    if size > limit:
        raise PayloadTooLarge(
            f"{name} is {size} bytes as JSON, over the limit of {limit} bytes "
            "(LEASING['MAX_PAYLOAD_BYTES'])."
        )
    if "\\u0000" in encoded:
        # PostgreSQL's jsonb cannot store NUL in strings; refuse it on every
        # database so SQLite and PostgreSQL accept the same payloads.
        raise PayloadNotSerializable(f"{name} contains a NUL character, which JSON columns reject.")
    return encoded


def aware_datetime(name: str, value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInput(f"{name} must be a datetime or None, got {value!r}.")
    if timezone.is_naive(value):
        raise InvalidInput(f"{name} must be timezone-aware, got naive {value.isoformat()}.")
    return value
