"""Statements of pauses: pause or resume a queue or a work type, and the claim's check.

An active pause is a `leasing_pauses` row with `resumed_at` NULL. Every claim
(`leasing.sql.work_items`) carries `not_paused(d)`: the candidate's
`queue:<name>` and `work_type:<name>` keys must not be among the active
pauses' keys. The active keys are one uncorrelated subquery, which the
database evaluates once per statement (PostgreSQL: an InitPlan building an
array; SQLite: a list built once), so the per-row check is an array or list
lookup and the claim stays a walk of the claim index in claim order (two
correlated NOT EXISTS probes per candidate row cost planning time and work
per row; this costs neither). Workers
read no cache: a pause committed before a claim statement starts is honoured
by that claim.

Resuming stamps the row (`resumed_*`) rather than deleting it, so the table is
the audit trail of every pause and resume.

Workers wait on a queue's wake (`leasing.sql.wakes`), so resuming a work type
wakes the queues that hold its claimable items (`queues_holding`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import transitions as T
from ..states import PauseKind
from .runner import Statement

if TYPE_CHECKING:
    from ..storage.base import Storage


QUEUE = f"'{PauseKind.QUEUE.value}'"
WORK_TYPE = f"'{PauseKind.WORK_TYPE.value}'"
# Written as Django renders the constraint's condition, so SQLite matches the
# ON CONFLICT target to the partial index.
ACTIVE = '"resumed_at" IS NULL'

# Every active pause as one key, `<kind>:<name>`; kinds hold no colon.
ACTIVE_KEYS = (
    "SELECT lp.kind || ':' || lp.name FROM leasing_pauses AS lp WHERE lp.resumed_at IS NULL"
)


def not_paused(d: Storage) -> str:
    """The claim's condition: the candidate's queue and work type are not paused."""
    queue_key = f"{QUEUE} || ':' || work_items.queue_name"
    type_key = f"{WORK_TYPE} || ':' || work_items.work_type"
    return d.not_paused(queue_key, type_key, ACTIVE_KEYS)


COLUMNS = "id, kind, name, paused_by, reason, paused_at, resumed_by, resume_reason, resumed_at"


def pause(d: Storage, kind: str, name: str, by: str, reason: str) -> Statement:
    """Start a pause unless one is active; returns the new row (none if already paused)."""
    sql = f"""
        INSERT INTO leasing_pauses (kind, name, paused_by, reason, paused_at)
        VALUES (%s, %s, %s, %s, {d.now})
        ON CONFLICT (kind, name) WHERE {ACTIVE} DO NOTHING
        RETURNING {COLUMNS}
    """
    return sql, [kind, name, by, reason]


def resume(d: Storage, kind: str, name: str, by: str, reason: str) -> Statement:
    """End the active pause; returns its row (none if it was not paused)."""
    sql = f"""
        UPDATE leasing_pauses
        SET resumed_at = {d.now}, resumed_by = %s, resume_reason = %s
        WHERE kind = %s AND name = %s AND resumed_at IS NULL
        RETURNING {COLUMNS}
    """
    return sql, [by, reason, kind, name]


def active(kind: str, name: str) -> Statement:
    """The active pause of a queue or work type, if any."""
    sql = f"""
        SELECT {COLUMNS} FROM leasing_pauses
        WHERE kind = %s AND name = %s AND resumed_at IS NULL
    """
    return sql, [kind, name]


# The most queues one work type's resume wakes: past them, workers of the rest
# find the items at their next poll, as they would without a wake.
MAX_WOKEN_QUEUES = 100


def queues_holding(work_type: str) -> Statement:
    """The queues holding claimable items of this work type (at most MAX_WOKEN_QUEUES).

    Its condition is the claim indexes' (`work_items_claim_type_idx` holds exactly
    these rows), so it reads the type's backlog, never finished or blocked items:
    an operator's resume pays it once.
    """
    sql = f"""
        SELECT DISTINCT queue_name FROM work_items
        WHERE status = {T.quoted(T.PENDING)} AND dependencies_left = 0 AND work_type = %s
        LIMIT %s
    """
    return sql, [work_type, MAX_WOKEN_QUEUES]
