"""The claim without its pause check: the baseline the claim scenario compares with.

Import after `django.setup()`. Claims built while the check is off carry
`TRUE` where the shipped statement checks the active pauses (the
`not_paused` clause of `leasing.sql.candidates.where`, which every claim
carries; a claim read in branches by work type also drops paused types before
their branch runs, and keeps that).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import leasing.sql.candidates as statements

SHIPPED = statements.not_paused


def _without(d: object) -> str:
    return "TRUE"


def set_pause_check(on: bool) -> None:
    """Claims built from now on carry the pause check (`on`) or not."""
    statements.not_paused = SHIPPED if on else _without


@contextlib.contextmanager
def pause_check_removed(removed: bool = True) -> Iterator[None]:
    """Claims built meanwhile have no pause check (when `removed`)."""
    set_pause_check(not removed)
    try:
        yield
    finally:
        set_pause_check(True)
