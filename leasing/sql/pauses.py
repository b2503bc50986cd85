"""Statements of pauses: pause or resume a queue or a work type, and the claim's check.

An active pause is a `leasing_pauses` row with `resumed_at` NULL. Every claim
(`leasing.sql.work_items`) carries `NOT_PAUSED`: two NOT EXISTS probes of the
partial unique index `leasing_pauses_active_uniq` (active rows only), one for
the candidate's queue and one for its work type. With no active pause that
is an index probe of an empty index per candidate row, and the claim stays a
walk of the claim index in claim order. Workers read no cache: a pause
committed before a claim statement starts is honoured by that claim.

Resuming stamps the row (`resumed_*`) rather than deleting it, so the table is
the audit trail of every pause and resume.
"""

from __future__ import annotations

from ..states import PauseKind
from .dialect import Dialect
from .runner import Statement

QUEUE = f"'{PauseKind.QUEUE.value}'"
WORK_TYPE = f"'{PauseKind.WORK_TYPE.value}'"
# Written as Django renders the constraint's condition, so SQLite matches the
# ON CONFLICT target to the partial index.
ACTIVE = '"resumed_at" IS NULL'

_PROBE = (
    "NOT EXISTS (SELECT 1 FROM leasing_pauses AS lp "
    "WHERE lp.kind = {kind} AND lp.name = work_items.{column} AND lp.resumed_at IS NULL)"
)
NOT_PAUSED = (
    f"{_PROBE.format(kind=QUEUE, column='queue_name')} "
    f"AND {_PROBE.format(kind=WORK_TYPE, column='work_type')}"
)

COLUMNS = "id, kind, name, paused_by, reason, paused_at, resumed_by, resume_reason, resumed_at"


def pause(d: Dialect, kind: str, name: str, by: str, reason: str) -> Statement:
    """Start a pause unless one is active; returns the new row (none if already paused)."""
    sql = f"""
        INSERT INTO leasing_pauses (kind, name, paused_by, reason, paused_at)
        VALUES (%s, %s, %s, %s, {d.now})
        ON CONFLICT (kind, name) WHERE {ACTIVE} DO NOTHING
        RETURNING {COLUMNS}
    """
    return sql, [kind, name, by, reason]


def resume(d: Dialect, kind: str, name: str, by: str, reason: str) -> Statement:
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
