"""ULIDs: their format, their order, and the batch encoding against the one-at-a-time one."""

from __future__ import annotations

import re

import pytest

from leasing import ids
from leasing.ids import new_ulid, new_ulids

ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


def _reference(prefix: str, value: int) -> str:
    """The random part encoded character by character, as the ULID spec writes it."""
    return prefix + ids._encode(value, 16)


def _by_pairs(value: int) -> str:
    """The random part as eight lookups of two characters each (10 bits a lookup)."""
    return "".join(ids._PAIRS[(value >> shift) & 1023] for shift in (70, 60, 50, 40, 30, 20, 10, 0))


@pytest.mark.parametrize(
    "start, count",
    [
        (0, 1),
        (12345, 1000),
        # Across a block of 2**20 values, whose shared upper bits are encoded once.
        ((7 << 20) - 3, 7),
        ((1 << 20) - 1, 2),
        # The largest random part and a run up to it.
        ((1 << 80) - 5, 5),
    ],
)
def test_a_batch_encodes_each_value_as_the_spec_does(start, count):
    prefix = ids._encode(1_700_000_000_000, 10)
    got = ids._consecutive(prefix, start, count)
    assert got == [_reference(prefix, start + i) for i in range(count)]
    assert got == [prefix + _by_pairs(start + i) for i in range(count)]


def test_a_batch_is_valid_distinct_and_increasing():
    batch = new_ulids(5000)
    assert all(ULID.fullmatch(u) for u in batch)
    assert len(set(batch)) == 5000
    assert batch == sorted(batch)


def test_ids_keep_increasing_across_calls_within_one_millisecond(monkeypatch):
    monkeypatch.setattr(ids.time, "time_ns", lambda: 1_700_000_000_000 * 1_000_000)
    monkeypatch.setattr(ids, "_last_ms", -1)
    first = new_ulids(3)
    single = new_ulid()
    second = new_ulids(4)
    made = [*first, single, *second]
    assert made == sorted(made) and len(set(made)) == len(made)
    assert {u[:10] for u in made} == {ids._encode(1_700_000_000_000, 10)}


def test_a_random_part_about_to_overflow_moves_to_the_next_millisecond(monkeypatch):
    now_ms = 1_700_000_000_000
    monkeypatch.setattr(ids.time, "time_ns", lambda: now_ms * 1_000_000)
    monkeypatch.setattr(ids, "_last_ms", now_ms)
    monkeypatch.setattr(ids, "_last_random", (1 << 80) - 2)
    batch = new_ulids(3)
    assert [u[:10] for u in batch] == [ids._encode(now_ms + 1, 10)] * 3
    assert batch == sorted(batch)


def test_nothing_asked_nothing_made():
    assert new_ulids(0) == []
    assert new_ulids(-1) == []
