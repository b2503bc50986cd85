"""The model test's view of the database: rows to compare, and time passing.

Time passes by moving a row's timestamps into the past with the database's own
clock (the expression the app's statements use), never the test process's.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from tests.support import transition_guard

# Every table a step writes, children before parents.
TABLES = (
    "work_item_dependencies",
    "checkpoints",
    "idempotency_keys",
    "work_items",
    "leasing_pauses",
    "workers",
    "leasing_finished_hours",
    "leasing_rollup_marks",
    "leasing_rate_buckets",
)
FINISHED = "('completed', 'failed', 'cancelled')"


def now() -> str:
    if connection.vendor == "postgresql":
        return "statement_timestamp()"
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


def clock(seconds: float) -> str:
    """The database clock moved by `seconds` (negative: the past), as SQL."""
    if connection.vendor == "postgresql":
        return f"(statement_timestamp() + make_interval(secs => {float(seconds)}))"
    return f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '{float(seconds):+.6f} seconds')"


def execute(sql: str, params: list[Any] | None = None) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.rowcount


def fetch(sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def clean() -> None:
    """Each example starts from empty tables (the test commits: transaction=True).

    Set-up, not a transition: the state machine's guard (tests/support/transition_guard.py)
    does not record these deletes, and forgets what earlier examples recorded.
    """
    with transition_guard.arranging():
        for table in TABLES:
            execute(f"DELETE FROM {table}")
    transition_guard.clear()


def undeclared_moves() -> list[tuple[Any, ...]]:
    """Status changes that leasing.transitions does not declare, since `clean()`."""
    return transition_guard.violations()


def expire_lease(item_id: str) -> None:
    """Time passes for one lease: its expiry is a minute ago."""
    changed = execute(
        f"UPDATE work_items SET lease_expires_at = {clock(-60)} "
        "WHERE work_item_id = %s AND status = 'in_progress'",
        [item_id],
    )
    assert changed == 1, f"{item_id} is not in progress"


def let_backoffs_pass() -> None:
    """Time passes for retries waiting out their backoff."""
    execute(
        f"UPDATE work_items SET run_after = {clock(-1)} "
        f"WHERE status = 'pending' AND run_after > {now()}"
    )


def end_periods() -> None:
    """Time passes for period keys: every period ended a second ago."""
    execute(
        f"UPDATE work_items SET unique_until = {clock(-1)} "
        f"WHERE unique_scope = 'period' AND unique_until > {now()}"
    )


def age_finished() -> None:
    """Time passes for finished items: they finished two hours ago."""
    execute(
        f"UPDATE work_items SET completed_at = {clock(-7200)} "
        f"WHERE status IN {FINISHED} AND completed_at IS NOT NULL"
    )


def rows() -> dict[str, dict[str, Any]]:
    """Every item, with what the database clock says of its availability and lease."""
    n = now()
    return {
        row["work_item_id"]: row
        for row in fetch(
            f"""
            SELECT work_item_id, status, lease_holder, lease_token, lease_expires_at,
                   retry_count, max_retries, dependencies_left, unique_key, unique_scope,
                   queue_name, work_type, error_message, completed_at, cancel_requested_at,
                   CASE WHEN COALESCE(run_after, created_at) <= {n} THEN 1 ELSE 0 END AS ready,
                   CASE WHEN lease_expires_at < {n} THEN 1 ELSE 0 END AS expired,
                   CASE WHEN unique_until > {n} THEN 1 ELSE 0 END AS period_live
            FROM work_items
            """
        )
    }


def edges() -> set[tuple[str, str]]:
    return {
        (row["dependency_id"], row["dependent_id"])
        for row in fetch("SELECT dependency_id, dependent_id FROM work_item_dependencies")
    }


def item_state(item_id: str) -> tuple[dict[str, Any] | None, int]:
    """One item's whole row and its number of checkpoints: what "changed nothing" compares."""
    found = fetch("SELECT * FROM work_items WHERE work_item_id = %s", [item_id])
    checkpoints = fetch("SELECT count(*) AS n FROM checkpoints WHERE work_item_id = %s", [item_id])
    return (found[0] if found else None), checkpoints[0]["n"]


def superseded_checkpoint(item_id: str) -> bool:
    """The item has an error_boundary checkpoint whose reason is "superseded"."""
    from leasing.models import Checkpoint

    snapshots = Checkpoint.objects.filter(
        work_item_id=item_id, checkpoint_type="error_boundary"
    ).values_list("snapshot_data", flat=True)
    return any(isinstance(s, dict) and s.get("reason") == "superseded" for s in snapshots)


def deletion_recorded(item_id: str) -> bool:
    """A state_transition checkpoint, tied to no item, records the item's deletion."""
    from leasing.models import Checkpoint

    snapshots = Checkpoint.objects.filter(
        work_item__isnull=True, checkpoint_type="state_transition"
    ).values_list("snapshot_data", flat=True)
    return any(
        isinstance(s, dict) and s.get("action") == "delete" and s.get("work_item_id") == item_id
        for s in snapshots
    )
