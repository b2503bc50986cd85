"""Statements of the operator actions: force-release, force-fail, retry, cancel, delete, run now.

Each action reads and locks the item, then changes it with a compare-and-swap
on the status and token it saw, so a row that moved on in between is never
overwritten. Each takes its status change from `leasing.transitions`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import transitions as T
from ..transitions import quoted
from .runner import Statement
from .unique import other_holder, superseded_message
from .work_items import LEASE_CLEARED, cancel_requested, cancelled_message

if TYPE_CHECKING:
    from ..storage.base import Storage


FORCE_RELEASE = "force_release"
FORCE_FAIL = "force_fail"
RETRY = "retry"
CANCEL = "cancel"
DELETE = "delete"
RUN_NOW = "run_now"

TRANSITION = {
    FORCE_RELEASE: T.FORCE_RELEASE,
    FORCE_FAIL: T.FORCE_FAIL,
    RETRY: T.RETRY_FAILED,
    CANCEL: T.CANCEL,
    DELETE: T.DELETE,
    RUN_NOW: T.RUN_NOW,
}

# Dependents still waiting for the row (not finished): they count it in dependencies_left.
_WAITING_DEPENDENTS = f"""(SELECT COUNT(*) FROM work_item_dependencies e
    JOIN work_items dependent ON dependent.work_item_id = e.dependent_id
    WHERE e.dependency_id = work_items.work_item_id
      AND dependent.status IN ({quoted(T.PENDING)}, {quoted(T.IN_PROGRESS)}))"""


def lock_item(d: Storage, item_id: str, *, for_delete: bool = False) -> Statement:
    """The item's state and the other holder of its unique key, row-locked until commit
    on PostgreSQL.

    `for_delete` locks the row FOR UPDATE, which an enqueue adding a dependent
    (its edge's foreign key takes a KEY SHARE lock) waits for, so the waiting
    dependents counted here stay those there are until the delete commits.
    """
    sql = f"""
        SELECT task_id, work_type, queue_name, status, lease_holder, lease_token,
               lease_expires_at, heartbeat_at, retry_count, max_retries,
               on_dependency_failure, cancel_requested_at, run_after,
               CASE WHEN run_after > {d.now} THEN 1 ELSE 0 END AS deferred,
               CASE WHEN has_dependents THEN {_WAITING_DEPENDENTS} ELSE 0 END
                   AS waiting_dependents,
               {other_holder("work_items")} AS key_holder
        FROM work_items WHERE work_item_id = %s
        {d.row_lock("UPDATE" if for_delete else "NO KEY UPDATE")}
    """
    return sql, [item_id]


def _set(d: Storage, action: str) -> str:
    """What `action` sets besides updated_at; one `%s`, the operator's message."""
    if action == FORCE_RELEASE:
        # Back to pending, unless it was asked to stop (cancelled: however its run ends,
        # it does not run again) or another item holds its unique key (superseded).
        # The request to stop stays on a cancelled row, as a hand-back leaves it.
        holder = other_holder("work_items")
        cancelled = cancel_requested()
        returns = f"(NOT {cancelled} AND {holder} IS NULL)"
        return f"""{T.FORCE_RELEASE.sets({T.CANCELLED: cancelled, T.PENDING: returns})},
            {LEASE_CLEARED}, run_after = NULL,
            completed_at = CASE WHEN {returns} THEN NULL ELSE {d.now} END,
            error_message = CASE WHEN {returns} THEN %s
                            WHEN {cancelled} THEN {cancelled_message("%s")}
                            ELSE {superseded_message(holder, "%s")} END"""
    if action == FORCE_FAIL:
        return f"{T.FORCE_FAIL.sets()}, {LEASE_CLEARED}, completed_at = {d.now}, error_message = %s"
    if action == CANCEL:
        return f"{T.CANCEL.sets()}, completed_at = {d.now}, error_message = %s"
    # Counted again: a dependency purged since the item ended is no longer waited for.
    return f"""{T.RETRY_FAILED.sets()}, retry_count = 0, interruptions = 0, run_after = NULL,
        cancel_requested_at = NULL, completed_at = NULL, error_message = %s,
        dependencies_left = {_not_completed_dependencies()}"""


def _not_completed_dependencies() -> str:
    """SQL: how many of the row's remaining dependencies have not completed."""
    return f"""(SELECT COUNT(*) FROM work_item_dependencies e
                JOIN work_items dep ON dep.work_item_id = e.dependency_id
                WHERE e.dependent_id = work_items.work_item_id
                  AND dep.status <> {quoted(T.COMPLETED)})"""


def transition(d: Storage, action: str, item_id: str, token: int, message: str) -> Statement:
    """Apply `action` if the item is still in one of its source statuses with `token`.

    A retry also requires that no other item holds the item's unique key.
    """
    messages = [message] * 3 if action == FORCE_RELEASE else [message]
    unheld = f"AND {other_holder('work_items')} IS NULL" if action == RETRY else ""
    superseded_by = "NULL AS superseded_by"
    if action == FORCE_RELEASE:
        superseded_by = (
            f"CASE WHEN status = {quoted(T.FAILED)} THEN {other_holder('work_items')} END "
            "AS superseded_by"
        )
    sql = f"""
        UPDATE work_items SET {_set(d, action)}, updated_at = {d.now}
        WHERE work_item_id = %s AND {TRANSITION[action].leaves()} AND lease_token = %s {unheld}
        RETURNING status, has_dependents, {superseded_by}
    """
    return sql, [*messages, item_id, token]


def run_now(d: Storage, item_id: str, token: int) -> Statement:
    """Make a deferred pending item due now: `run_after` is the database's now.

    Nothing else changes: a paused item still waits for its pause, and an item
    with dependencies for them.
    """
    sql = f"""
        UPDATE work_items SET run_after = {d.now}, updated_at = {d.now}
        WHERE work_item_id = %s AND {T.RUN_NOW.leaves()} AND lease_token = %s
          AND run_after > {d.now}
        RETURNING status, has_dependents, NULL AS superseded_by
    """
    return sql, [item_id, token]


def delete(d: Storage, item_id: str, token: int) -> list[Statement]:
    """Delete one item not in progress, with the token the operator saw: its dependency
    edges and checkpoints go, idempotency keys keep their responses and lose the link.

    The last statement returns the deleted row's status (none: nothing deleted).
    """
    return [
        (
            "DELETE FROM work_item_dependencies WHERE dependency_id = %s OR dependent_id = %s",
            [item_id, item_id],
        ),
        ("DELETE FROM checkpoints WHERE work_item_id = %s", [item_id]),
        ("UPDATE idempotency_keys SET work_item_id = NULL WHERE work_item_id = %s", [item_id]),
        (
            f"""DELETE FROM work_items
                WHERE work_item_id = %s AND {T.DELETE.leaves()} AND lease_token = %s
                RETURNING status, FALSE AS has_dependents, NULL AS superseded_by""",
            [item_id, token],
        ),
    ]


def request_cancel(d: Storage, item_id: str, token: int) -> Statement:
    """Ask a running item to stop (no status change: its run ends cancelled once its
    handler sees the request, or its lease runs out)."""
    sql = f"""
        UPDATE work_items SET cancel_requested_at = {d.now}, updated_at = {d.now}
        WHERE work_item_id = %s AND status = {quoted(T.IN_PROGRESS)} AND lease_token = %s
          AND cancel_requested_at IS NULL
        RETURNING status, has_dependents, NULL AS superseded_by
    """
    return sql, [item_id, token]
