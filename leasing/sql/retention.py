"""Statements that purge finished work items (their checkpoints go by ON DELETE CASCADE)."""

from __future__ import annotations

from .dialect import Dialect
from .runner import Statement


def _finished_before(d: Dialect, statuses: list[str], age_seconds: float) -> Statement:
    status_sql, status_params = d.in_list("status", statuses)
    return (
        f"{status_sql} AND completed_at < {d.clock()}",
        [*status_params, d.offset(-age_seconds)],
    )


def count_finished(d: Dialect, statuses: list[str], age_seconds: float) -> Statement:
    where, params = _finished_before(d, statuses, age_seconds)
    return f"SELECT COUNT(*) AS n FROM work_items WHERE {where}", params


def delete_finished(d: Dialect, statuses: list[str], age_seconds: float, limit: int) -> Statement:
    where, params = _finished_before(d, statuses, age_seconds)
    sql = f"""
        DELETE FROM work_items WHERE work_item_id IN (
            SELECT work_item_id FROM work_items WHERE {where} LIMIT %s
        )
        RETURNING work_item_id
    """
    return sql, [*params, limit]
