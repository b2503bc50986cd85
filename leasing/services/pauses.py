"""Pausing and resuming a queue or a work type: `leasing.pause()`, `leasing.resume()`.

A pause stops claims, nothing else: items already in flight finish, enqueues
go on, and every worker skips the paused queue or work type from its next
claim on (the claim statement checks `leasing_pauses` itself; no worker
caches it). Resuming lets the backlog drain; on PostgreSQL idle workers of a
resumed queue, or of the queues holding a resumed work type's items, are
woken by a NOTIFY.

Each pause and resume names who and why; the `leasing_pauses` row keeps both
(with the database clock's time), so the table is the audit trail.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from .. import validation
from ..exceptions import InvalidInput
from ..sql import pauses as sql
from ..sql.runner import run, run_one, to_datetime, translate_db_errors
from ..states import PauseKind
from ..storage import storage_for

MAX_NAME = 255
MAX_ACTOR = 150
MAX_REASON = 1000


@dataclass(frozen=True, slots=True)
class PauseState:
    """A queue's or work type's pause after `pause()` or `resume()`.

    `changed` is False when there was nothing to do (already paused, or not
    paused); the other fields then describe the pause as it stands.
    """

    kind: str
    name: str
    paused: bool
    changed: bool
    paused_by: str | None = None
    reason: str | None = None
    paused_at: datetime | None = None
    resumed_by: str | None = None
    resume_reason: str | None = None
    resumed_at: datetime | None = None

    def describe(self) -> str:
        """One line for a message or a command's output."""
        label = f"{PauseKind(self.kind).label.lower()} {self.name!r}"
        if self.paused:
            verb = "paused" if self.changed else "was already paused"
            return f"The {label} {verb} (by {self.paused_by}: {self.reason})."
        if self.changed:
            return f"The {label} resumed (by {self.resumed_by}: {self.resume_reason})."
        return f"The {label} was not paused; nothing changed."


def target(queue: Any = None, work_type: Any = None) -> tuple[str, str]:
    """The (kind, name) a caller means: exactly one of a queue or a work type."""
    if (queue is None) == (work_type is None):
        raise InvalidInput("Name exactly one of queue= or work_type=.")
    if queue is not None:
        return PauseKind.QUEUE.value, validation.non_empty_text("queue", queue, max_length=MAX_NAME)
    return PauseKind.WORK_TYPE.value, validation.non_empty_text(
        "work_type", work_type, max_length=MAX_NAME
    )


def _who(by: Any, reason: Any) -> tuple[str, str]:
    by = validation.non_empty_text("by", by, max_length=MAX_ACTOR).strip()
    reason = validation.non_empty_text("reason", reason, max_length=MAX_REASON).strip()
    return by, reason


def _state(row: dict[str, Any], *, changed: bool) -> PauseState:
    return PauseState(
        kind=row["kind"],
        name=row["name"],
        paused=row["resumed_at"] is None,
        changed=changed,
        paused_by=row["paused_by"],
        reason=row["reason"],
        paused_at=to_datetime(row["paused_at"]),
        resumed_by=row["resumed_by"],
        resume_reason=row["resume_reason"],
        resumed_at=to_datetime(row["resumed_at"]),
    )


def pause(
    queue: str | None = None,
    work_type: str | None = None,
    *,
    by: str,
    reason: str,
    using: str = "default",
) -> PauseState:
    """Stop every worker claiming items of this queue or work type (from its next claim)."""
    using = validation.database_alias(using)
    kind, name = target(queue, work_type)
    by, reason = _who(by, reason)
    d = storage_for(using)
    with translate_db_errors(), transaction.atomic(using=using):
        row = run_one(using, sql.pause(d, kind, name, by, reason))
        if row is not None:
            return _state(row, changed=True)
        current = run_one(using, sql.active(kind, name))
    if current is None:  # pragma: no cover - resumed between the two statements
        return pause(queue, work_type, by=by, reason=reason, using=using)
    return _state(current, changed=False)


def resume(
    queue: str | None = None,
    work_type: str | None = None,
    *,
    by: str,
    reason: str,
    using: str = "default",
) -> PauseState:
    """Let workers claim this queue or work type again."""
    using = validation.database_alias(using)
    kind, name = target(queue, work_type)
    by, reason = _who(by, reason)
    d = storage_for(using)
    with translate_db_errors(), transaction.atomic(using=using):
        row = run_one(using, sql.resume(d, kind, name, by, reason))
        if row is not None and d.can_listen:
            # Wake the idle workers at commit: workers wait on a queue's wake, so
            # a work type wakes the queues holding its items.
            if kind == PauseKind.QUEUE:
                d.notify([name])
            else:
                d.notify(r["queue_name"] for r in run(using, sql.queues_holding(name)))
    if row is None:
        return PauseState(kind=kind, name=name, paused=False, changed=False)
    return _state(row, changed=True)


__all__ = ["PauseState", "pause", "resume", "target"]
