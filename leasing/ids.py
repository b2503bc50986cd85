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
    """Return `count` ULIDs in increasing order (one lock, one clock read).

    The random part of the first id is incremented for each further id, as
    the ULID spec's monotonic mode does within one millisecond.
    """
    global _last_ms, _last_random
    if count <= 0:
        return []
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            now_ms = _last_ms
            start = _last_random + 1
        else:
            start = int.from_bytes(os.urandom(10), "big") >> 1
        if start + count >= 1 << 80:
            now_ms += 1
            start = 0
        _last_ms = now_ms
        _last_random = start + count - 1
    return _consecutive(_encode(now_ms, 10), start, count)


# Two Crockford characters per 10 bits: the 80-bit random part is 8 lookups.
_PAIRS = [_CROCKFORD[i >> 5] + _CROCKFORD[i & 31] for i in range(1024)]
# Consecutive values share all but their last 20 bits (two pairs) within a block.
_LOW_BITS = 20


def _consecutive(prefix: str, start: int, count: int) -> list[str]:
    """`prefix` + the random parts of start, start + 1, ...: each block of 2**20
    values encodes its shared 60 bits once (a sweep makes 1,000 ids a batch, an
    enqueue one per item)."""
    ids: list[str] = []
    pairs = _PAIRS
    value, end = start, start + count
    while value < end:
        high = value >> _LOW_BITS
        block_end = min(end, (high + 1) << _LOW_BITS)
        head = prefix + "".join(pairs[(high >> shift) & 1023] for shift in (50, 40, 30, 20, 10, 0))
        ids += [head + pairs[(v >> 10) & 1023] + pairs[v & 1023] for v in range(value, block_end)]
        value = block_end
    return ids
