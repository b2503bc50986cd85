"""Statements of the operator actions: force-release, force-fail, retry a failed item.

Each action reads and locks the item, then changes it with a compare-and-swap
on the status and token it saw, so a row that moved on in between is never
overwritten.
"""

from __future__ import annotations

from .dialect import Dialect
from .runner import Statement
from .work_items import FAILED, LEASE_CLEARED, PENDING

FORCE_RELEASE = "force_release"
FORCE_FAIL = "force_fail"
RETRY = "retry"

# What each action sets besides the operator's message and updated_at.
_SETS = {
    FORCE_RELEASE: f"status = {PENDING}, {LEASE_CLEARED}, run_after = NULL",
    FORCE_FAIL: f"status = {FAILED}, {LEASE_CLEARED}, completed_at = {{now}}",
    RETRY: (
        f"status = {PENDING}, retry_count = 0, interruptions = 0, run_after = NULL, "
        "completed_at = NULL"
    ),
}


def lock_item(d: Dialect, item_id: str) -> Statement:
    """The item's state, row-locked until commit on PostgreSQL."""
    sql = f"""
        SELECT task_id, work_type, status, lease_holder, lease_token, lease_expires_at,
               heartbeat_at, retry_count, max_retries, on_dependency_failure
        FROM work_items WHERE work_item_id = %s
        {"FOR NO KEY UPDATE" if d.is_postgres else ""}
    """
    return sql, [item_id]


def transition(
    d: Dialect, action: str, item_id: str, allowed: tuple[str, ...], token: int, message: str
) -> Statement:
    """Apply `action` if the item is still in one of `allowed` with `token`."""
    set_sql = _SETS[action].format(now=d.now)
    status_sql, status_params = d.in_list("status", list(allowed))
    sql = f"""
        UPDATE work_items SET {set_sql}, error_message = %s, updated_at = {d.now}
        WHERE work_item_id = %s AND {status_sql} AND lease_token = %s
        RETURNING status, has_dependents
    """
    return sql, [message, item_id, *status_params, token]
