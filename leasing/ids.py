"""ULID generation: 26-character, lexicographically sortable, monotonic per process."""

from __future__ import annotations

import os
import threading
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_lock = threading.Lock()
_last_ms = -1
_last_random = 0


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        value, index = divmod(value, 32)
        chars.append(_CROCKFORD[index])
    return "".join(reversed(chars))


def new_ulid() -> str:
    """Return a new ULID.

    Within one millisecond the random part is incremented, so ids made by one
    process sort in creation order; that makes them a tie-breaker for rows with
    the same `created_at` (one bulk INSERT shares one database timestamp).
    """
    global _last_ms, _last_random
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            now_ms = _last_ms
            _last_random += 1
            if _last_random >= 1 << 80:
                now_ms += 1
                _last_random = int.from_bytes(os.urandom(10), "big") >> 1
        else:
            _last_random = int.from_bytes(os.urandom(10), "big") >> 1
        _last_ms = now_ms
        return _encode(now_ms, 10) + _encode(_last_random, 16)


def new_ulids(count: int) -> list[str]:
    """Return `count` ULIDs in increasing order."""
    return [new_ulid() for _ in range(count)]
