"""Statements that add work items, and the NOTIFY that wakes idle workers.

The rows arrive validated (`leasing.services.enqueue`; a COPY's rows may be
validated as the COPY reads them, and a bad one aborts it). PostgreSQL inserts a
batch with one `INSERT ... SELECT unnest(...)` (a fixed number of parameters
whatever the batch size) or, from `COPY_THRESHOLD` rows on, one `COPY`;
SQLite with multi-row VALUES under its bound-variable limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import transitions as T

if TYPE_CHECKING:
    from ..rates import RateLimit

NOTIFY_CHANNEL = "leasing_enqueue"
NEW_STATUS = T.ENQUEUE.target()
# From this many items on, PostgreSQL loads them with one COPY statement: about
# faster than INSERT ... SELECT unnest() for large batches, slower for a few.
COPY_THRESHOLD = 2000


@dataclass(slots=True)
class NewItem:
    """One validated row to insert (not frozen: a frozen dataclass's __init__ sets
    each field through object.__setattr__, and a large batch makes one per item)."""

    work_item_id: str
    task_id: str
    work_type: str
    input_json: str | None
    input_data: Any
    priority: int
    max_retries: int
    run_after: datetime | None
    queue_name: str
    # Unique enqueue (`sql.unique`): the key, its scope and, for a period, its length.
    unique_key: str | None = None
    unique_scope: str | None = None
    unique_seconds: float | None = None
    # Dependencies: work item ids (str) and positions in the same batch (int).
    depends_on: tuple[str | int, ...] = ()
    on_dependency_failure: str | None = None
    # Rate limits and fair claims (`leasing.rates`, `leasing.sql.fairness`).
    rate_key: str | None = None
    fairness_key: str | None = None
    rate_limit: RateLimit | None = None

    @property
    def plain(self) -> bool:
        """Neither a unique key nor dependencies: the bulk INSERT (or COPY) path."""
        return self.unique_key is None and not self.depends_on


COLUMNS = (
    "work_item_id, task_id, work_type, status, priority, lease_token, retry_count, "
    "max_retries, run_after, queue_name, input_data, rate_key, fairness_key"
)


# --- items with a unique key or dependencies ------------------------------------------------

RICH_COLUMNS = (
    f"{COLUMNS}, unique_key, unique_scope, unique_until, dependencies_left, has_dependents, "
    "on_dependency_failure"
)


@dataclass(frozen=True, slots=True)
class RichRow:
    """A row with a unique key or dependencies, and its provisional dependency columns."""

    item: NewItem
    dependencies_left: int
    has_dependents: bool
