"""How a manager's next claim reads the claim index: one walk, or one branch per work type.

A claim filtered to some work types can walk the claim index in claim order
(`leasing.sql.candidates.plain_candidates`) or read one branch per type
(`type_branches`). Which is cheaper depends on how many of its types' items
are claimable, which the previous claim with the same filters tells:

* it came back full: its types have work in depth; the walk stops after the
  batch, and branches would each lock up to a batch (rows beyond the batch
  locked for nothing);
* it came back short: the walk went to the end of the claim index, past every
  pending item of the other types, and the next one would too (an idle
  worker woken by each enqueue); branches read only the few items there are
  and lock no more than exist.

So a manager starts with branches (a worker starts idle), and each claim sets
the shape of the next. The state is one (filters, shallow) pair: a caller
switching filters gets branches for its first claim with the new ones.
"""

from __future__ import annotations

import threading

from ..sql.terms import ClaimFilters


class ClaimShape:
    """Whether the next claim with given filters reads one branch per work type."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._filters: ClaimFilters | None = None
        self._shallow = True

    def by_type(self, filters: ClaimFilters) -> bool:
        with self._lock:
            return self._shallow or filters != self._filters

    def claimed(self, filters: ClaimFilters, asked: int, got: int) -> None:
        """Record a claim's result: fewer rows than asked means its types run shallow."""
        with self._lock:
            self._filters, self._shallow = filters, got < asked
