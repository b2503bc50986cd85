"""Fair claims: a claim that may take from a fair queue takes turns across its fairness keys.

The statement and why it stays an index read are in `leasing.sql.fairness`.
Here: the manager's cursors (per fair queue, the key it served last), moved
on after each claim, so its next claim starts the rotation after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..conf import get_settings
from ..sql import fairness as sql
from ..sql.work_items import LEASE_COLUMNS
from ..storage import storage_for

if TYPE_CHECKING:
    from ..sql.limits import Limits
    from ..sql.terms import ClaimFilters, LeaseTerms
    from .held import Lease
    from .leases import LeaseManager

QUEUE_COLUMN = LEASE_COLUMNS.index("queue_name")
TURN_COLUMNS = len(LEASE_COLUMNS)  # a fair claim's rows carry the key, then its place


def rotation(manager: LeaseManager, filters: ClaimFilters) -> sql.Fairness | None:
    """The rotation of the manager's next claim with these filters (None: no fair queue)."""
    conf = get_settings()
    if not conf.fair_queues:
        return None
    return sql.Fairness.for_claim(
        filters, conf.fair_queues, conf.fairness_weights, manager.fair_cursors
    )


def claim_fairly(
    manager: LeaseManager,
    n: int,
    terms: LeaseTerms,
    filters: ClaimFilters,
    limits: Limits,
    fairness: sql.Fairness,
) -> list[Lease]:
    """Claim up to `n` items in turn order across the fair queues' keys."""
    d = storage_for(manager.using)
    statement = d.claim(manager.worker_id, n, terms, filters, limits, fairness=fairness)
    rows = d.run_claim(statement, limits)
    turns = [(row[QUEUE_COLUMN], row[TURN_COLUMNS], row[TURN_COLUMNS + 1]) for row in rows]
    manager.fair_cursors.update(sql.next_cursors(fairness, turns))
    return manager.leases_from_rows(rows)
