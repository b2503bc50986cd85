"""Operator actions: force-release, force-fail and retry (SPEC §4, §12).

Each action is a fenced compare-and-swap: it applies only if the item is still
in the status (and, for leased items, has the lease token) the operator saw
when they confirmed. Otherwise it is skipped and the result says why. An
applied action writes a `state_transition` checkpoint naming the actor and the
reason in the same transaction, so the audit trail cannot disagree with the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from . import validation
from .checkpoints import create_checkpoint
from .db import Dialect, execute, to_datetime, translate_db_errors
from .exceptions import InvalidInput, WorkItemNotFound
from .models import CheckpointType, WorkItemStatus


class Action:
    FORCE_RELEASE = "force_release"
    FORCE_FAIL = "force_fail"
    RETRY = "retry"

    choices = (FORCE_RELEASE, FORCE_FAIL, RETRY)


@dataclass(frozen=True, slots=True)
class OperatorResult:
    """The outcome of one operator action on one item."""

    work_item_id: str
    action: str
    applied: bool
    old_status: str | None
    new_status: str | None
    detail: str


# The statuses each action accepts, and the status it leaves.
_FROM = {
    Action.FORCE_RELEASE: (WorkItemStatus.IN_PROGRESS,),
    Action.FORCE_FAIL: (WorkItemStatus.IN_PROGRESS, WorkItemStatus.PENDING),
    Action.RETRY: (WorkItemStatus.FAILED,),
}
_TO = {
    Action.FORCE_RELEASE: WorkItemStatus.PENDING,
    Action.FORCE_FAIL: WorkItemStatus.FAILED,
    Action.RETRY: WorkItemStatus.PENDING,
}


def force_release(
    work_item_id: str,
    *,
    expected_token: int | None,
    actor: str,
    reason: str,
    using: str = "default",
) -> OperatorResult:
    """Put a leased item back to `pending` (not counted as a retry).

    The old holder's token no longer matches a held lease afterwards, so its
    renewals, checkpoints and release are refused by the fence.
    """
    return apply_action(
        Action.FORCE_RELEASE,
        work_item_id,
        expected_token=expected_token,
        actor=actor,
        reason=reason,
        using=using,
    )


def force_fail(
    work_item_id: str,
    *,
    expected_token: int | None,
    actor: str,
    reason: str,
    using: str = "default",
) -> OperatorResult:
    """Fail a pending or leased item for good."""
    return apply_action(
        Action.FORCE_FAIL,
        work_item_id,
        expected_token=expected_token,
        actor=actor,
        reason=reason,
        using=using,
    )


def retry_failed(
    work_item_id: str,
    *,
    expected_token: int | None,
    actor: str,
    reason: str,
    using: str = "default",
) -> OperatorResult:
    """Send a failed item back to `pending` with a fresh retry budget."""
    return apply_action(
        Action.RETRY,
        work_item_id,
        expected_token=expected_token,
        actor=actor,
        reason=reason,
        using=using,
    )


# `expected_heartbeat_at` default: do not compare the heartbeat.
UNCHECKED: Any = object()


def apply_action(
    action: str,
    work_item_id: str,
    *,
    expected_token: int | None,
    actor: str,
    reason: str,
    expected_heartbeat_at: datetime | None = UNCHECKED,
    using: str = "default",
) -> OperatorResult:
    """Apply one operator action as a fenced compare-and-swap.

    `expected_token` is the `lease_token` the operator saw (None: do not check
    it); a new claim changes it. `expected_heartbeat_at` is the `heartbeat_at`
    they saw: every renewal moves it, so a lease renewed since the page was
    shown (same holder, same token) is told apart too. A changed status, token
    or heartbeat skips the item rather than guessing.
    """
    if action not in Action.choices:
        raise InvalidInput(
            f"Unknown action {action!r}; expected one of {', '.join(Action.choices)}."
        )
    work_item_id = validation.non_empty_text("work_item_id", work_item_id)
    actor = validation.non_empty_text("actor", actor, max_length=150)
    reason = validation.non_empty_text("reason", reason, max_length=1000).strip()
    if expected_token is not None:
        expected_token = validation.integer("expected_token", expected_token, minimum=0)

    d = Dialect(using)
    allowed = _FROM[action]
    new_status = _TO[action]
    with translate_db_errors(), transaction.atomic(using=using):
        rows = execute(
            using,
            f"""
            SELECT task_id, status, lease_holder, lease_token, lease_expires_at, heartbeat_at,
                   retry_count
            FROM work_items WHERE work_item_id = %s
            {"FOR NO KEY UPDATE" if d.is_postgres else ""}
            """,
            [work_item_id],
        )
        if not rows:
            raise WorkItemNotFound(work_item_id)
        before = rows[0]
        skipped = _skip_reason(before, allowed, expected_token, expected_heartbeat_at)
        if skipped:
            return OperatorResult(
                work_item_id,
                action,
                applied=False,
                old_status=before["status"],
                new_status=None,
                detail=f"skipped: {skipped}",
            )

        message = f"{_LABEL[action]} by {actor}: {reason}"
        set_sql, set_params = _set_clause(action, d, message)
        placeholders = ", ".join(["%s"] * len(allowed))
        updated = execute(
            using,
            f"""
            UPDATE work_items SET {set_sql}, updated_at = {d.now}
            WHERE work_item_id = %s AND status IN ({placeholders}) AND lease_token = %s
            RETURNING status
            """,
            [*set_params, work_item_id, *allowed, before["lease_token"]],
        )
        if not updated:  # pragma: no cover - the row is locked; kept as the CAS guard
            return OperatorResult(
                work_item_id, action, False, before["status"], None, "skipped: changed concurrently"
            )
        snapshot: dict[str, Any] = {
            "action": action,
            "actor": actor,
            "reason": reason,
            "old_status": before["status"],
            "new_status": new_status,
            "lease_holder": before["lease_holder"],
            "lease_token": before["lease_token"],
            "lease_expires_at": _iso(before["lease_expires_at"]),
            "retry_count": before["retry_count"],
        }
        create_checkpoint(
            before["task_id"],
            CheckpointType.STATE_TRANSITION,
            snapshot,
            work_item=work_item_id,
            metadata={"source": "operator"},
            using=using,
        )
    return OperatorResult(
        work_item_id,
        action,
        applied=True,
        old_status=before["status"],
        new_status=new_status,
        detail=message,
    )


_LABEL = {
    Action.FORCE_RELEASE: "Force-released",
    Action.FORCE_FAIL: "Force-failed",
    Action.RETRY: "Retried",
}


def _skip_reason(
    before: dict[str, Any],
    allowed: tuple[str, ...],
    expected_token: int | None,
    expected_heartbeat_at: datetime | None,
) -> str | None:
    """Why the row is no longer the one the operator saw, or None."""
    if before["status"] not in allowed:
        return f"it is {before['status']}, not {' or '.join(allowed)}"
    if expected_token is not None and before["lease_token"] != expected_token:
        return (
            "its lease changed since the page was shown "
            f"(token {expected_token} -> {before['lease_token']})"
        )
    if expected_heartbeat_at is not UNCHECKED and (
        to_datetime(before["heartbeat_at"]) != expected_heartbeat_at
    ):
        return "its lease was renewed since the page was shown"
    return None


def _set_clause(action: str, d: Dialect, message: str) -> tuple[str, list[Any]]:
    if action == Action.FORCE_RELEASE:
        return (
            "status = 'pending', lease_holder = NULL, lease_expires_at = NULL, "
            "run_after = NULL, error_message = %s",
            [message],
        )
    if action == Action.FORCE_FAIL:
        return (
            f"status = 'failed', lease_holder = NULL, lease_expires_at = NULL, "
            f"completed_at = {d.now}, error_message = %s",
            [message],
        )
    return (
        "status = 'pending', retry_count = 0, run_after = NULL, completed_at = NULL, "
        "error_message = %s",
        [message],
    )


def _iso(value: Any) -> str | None:
    dt = to_datetime(value)
    return None if dt is None else dt.isoformat()
