"""Reads about the pending backlog that a runtime decides on."""

from __future__ import annotations

from ..sql.candidates import due
from ..sql.runner import run
from ..sql.terms import ClaimFilters
from ..storage import storage_for
from .terms import claim_limits


def due_within(seconds: float, filters: ClaimFilters, *, using: str = "default") -> bool:
    """Is a pending item these filters claim due within `seconds` (a retry's backoff, say)
    that no pause holds back, nor a concurrency limit full now?

    The claim's own condition (`sql.candidates.where`): blocked items are not
    due whatever their `run_after`, and an item without one is due since its
    creation. A limit full with other processes' runs may open within the
    poll; a draining worker does not wait for it (`runworker --burst`).
    """
    d = storage_for(using)
    return bool(run(using, due(d, filters, seconds, claim_limits(filters))))
