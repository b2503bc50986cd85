"""Argument checks shared by the services.

Each check raises a specific `InvalidInput` subclass before any row is
touched, and returns the normalised value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal, overload

from django.db import connections
from django.utils import timezone

# A module, not its names: `conf` imports this module in turn.
from . import conf as leasing_conf
from .exceptions import (
    InvalidDuration,
    InvalidHeartbeatInterval,
    InvalidInput,
    PayloadNotSerializable,
    PayloadTooLarge,
)

PG_INT_MIN, PG_INT_MAX = -(2**31), 2**31 - 1
# Ids and names (task ids, work types, queues, worker ids, idempotency keys):
# longer ones cannot be indexed or sent in a NOTIFY, and are typos anyway.
MAX_KEY_LENGTH = 255
# JSON nested deeper than this is refused (the encoder and jsonb give up far
# later, with a RecursionError or a stack-depth error instead of a message).
MAX_JSON_DEPTH = 100
# One encoder for every payload: json.dumps() with options builds a new one per
# call. ensure_ascii=False keeps lone surrogates as characters, so the UTF-8
# encoding that measures the size also finds them.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)
# The encoder's C core, made once: `JSONEncoder.encode` makes a new one for
# every value, most of the cost of a small payload. It has no circular
# reference markers (a markers dict shared between calls would keep the ids an
# error left in it): a cycle recurses until RecursionError, refused below as
# nested too deep, which it is.
_MAKE_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODE = (
    None
    if _MAKE_C_ENCODER is None
    else _MAKE_C_ENCODER(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
)
# Ten years: longer "durations" are typos, and make_interval() would overflow first.
MAX_SECONDS = 10 * 365 * 24 * 3600


def positive_seconds(name: str, value: Any) -> float:
    """A positive, finite number of seconds (ints and floats; not bools or strings)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidDuration(f"{name} must be a number of seconds, got {value!r}.")
    if isinstance(value, int) and value > MAX_SECONDS:
        # Before math.isfinite(), which overflows on an int past a float (10**400);
        # no repr() of a huge one either (past 4300 digits it raises ValueError).
        shown = (
            repr(value) if value.bit_length() <= 64 else f"an integer of {value.bit_length()} bits"
        )
        raise InvalidDuration(f"{name} must be at most {MAX_SECONDS} seconds, got {shown}.")
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


# The largest integer a database column (bigint) stores: no integer the API
# takes may be larger, or the driver raises instead of a clear error.
MAX_BIGINT = 2**63 - 1
# The most expired leases one sweep transaction recovers (`RecoverySweep`'s
# `batch_size`, `LEASING["SWEEP_BATCH_SIZE"]`): more holds too many row locks.
MAX_SWEEP_BATCH_SIZE = 5000


def integer(name: str, value: Any, *, minimum: int | None = None, maximum: int = MAX_BIGINT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer, got {_short(value)}.")
    # _short: an int of more than 4300 digits cannot even be shown (a ValueError).
    if minimum is not None and value < minimum:
        raise InvalidInput(f"{name} must be at least {minimum}, got {_short(value)}.")
    if value > maximum:
        raise InvalidInput(f"{name} must be at most {maximum}, got {_short(value)}.")
    return value


def storable_text(name: str, value: str) -> str:
    """Text every database stores: no NUL character, no lone surrogate."""
    if "\x00" in value:
        raise InvalidInput(f"{name} must not contain NUL characters.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{name} must not contain lone surrogate characters.") from None
    return value


def non_empty_text(name: str, value: Any, *, max_length: int = MAX_KEY_LENGTH) -> str:
    """A non-empty, storable string of at most `max_length` characters."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{name} must be a non-empty string, got {_short(value)}.")
    if len(value) > max_length:
        raise InvalidInput(f"{name} must be at most {max_length} characters, got {len(value)}.")
    return storable_text(name, value)


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4300 digits (sys.set_int_max_str_digits)
        text = f"an {type(value).__name__} too large to show"
    return text if len(text) <= 80 else f"{text[:77]}..."


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


@overload
def payload(name: str, value: Any, *, required: Literal[True], limit: int | None = None) -> str: ...
@overload
def payload(
    name: str, value: Any, *, required: bool = False, limit: int | None = None
) -> str | None: ...
def payload(
    name: str, value: Any, *, required: bool = False, limit: int | None = None
) -> str | None:
    """Encode a JSON payload that both databases store, or raise `PayloadNotSerializable`.

    Refused: values JSON cannot encode, NaN and infinities, NUL characters
    and lone surrogates in strings (jsonb rejects both), nesting deeper than
    `MAX_JSON_DEPTH`, and more than `limit` bytes once encoded (None:
    `LEASING["MAX_PAYLOAD_BYTES"]`; the settings pass their own while they are
    being read). Returns the JSON text (None for a missing optional payload),
    so callers encode once and reuse the result.
    """
    if value is None and not required:
        return None
    try:
        encoded = _ENCODER.encode(value) if _C_ENCODE is None else "".join(_C_ENCODE(value, 0))
    except RecursionError:
        raise PayloadNotSerializable(
            f"{name} is nested more than {MAX_JSON_DEPTH} levels deep."
        ) from None
    except (TypeError, ValueError) as exc:
        raise PayloadNotSerializable(f"{name} is not JSON-serializable: {exc}") from exc
    try:
        size = len(encoded) if encoded.isascii() else len(encoded.encode("utf-8"))
    except UnicodeEncodeError:
        raise PayloadNotSerializable(
            f"{name} contains a lone surrogate character, which JSON columns reject."
        ) from None
    if limit is None:
        limit = leasing_conf.get_settings().max_payload_bytes
    if size > limit:
        raise PayloadTooLarge(
            f"{name} is {size} bytes as JSON, over the limit of {limit} bytes "
            "(LEASING['MAX_PAYLOAD_BYTES'])."
        )
    if "\\u0000" in encoded:
        raise PayloadNotSerializable(f"{name} contains a NUL character, which JSON columns reject.")
    # Cheap test first: a value cannot be deeper than its number of brackets.
    if encoded.count("[") + encoded.count("{") > MAX_JSON_DEPTH and _depth(value) > MAX_JSON_DEPTH:
        raise PayloadNotSerializable(f"{name} is nested more than {MAX_JSON_DEPTH} levels deep.")
    return encoded


def _depth(value: Any) -> int:
    """How deeply lists and dicts nest in `value` (iterative: no recursion limit)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def database_alias(value: Any, name: str = "using") -> str:
    """An alias of settings.DATABASES: the `using=` of every public function.

    Checked before anything is read or written, so a typo is this error
    rather than Django's `ConnectionDoesNotExist` (or a `TypeError` for a
    non-string) from somewhere inside.
    """
    if isinstance(value, str) and value in connections.settings:
        return value
    known = ", ".join(repr(alias) for alias in connections.settings) or "none"
    raise InvalidInput(
        f"{name} must name a database alias of settings.DATABASES ({known}), got {_short(value)}."
    )


def aware_datetime(name: str, value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInput(f"{name} must be a datetime or None, got {value!r}.")
    if timezone.is_naive(value):
        raise InvalidInput(f"{name} must be timezone-aware, got naive {value.isoformat()}.")
    try:
        # Stored in UTC: 9999-12-31 23:00-05:00 is in year 10000 there, which PostgreSQL
        # stores but no reader (Python's datetime) can read back.
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(
            f"{name} {value.isoformat()} is out of range: in UTC it falls outside the years "
            "1 to 9999."
        ) from None
