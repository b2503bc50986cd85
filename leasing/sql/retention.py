"""Statements that purge finished work items, with their checkpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import transitions as T
from ..states import UniqueScope
from ..transitions import quoted
from .checkpoints import resume_point
from .runner import Statement
from .schedules import TICK_KEY_PREFIX

if TYPE_CHECKING:
    from ..storage.base import Storage


# A failed or cancelled item that an unfinished dependent still waits for (it
# chose "wait": the dependency may be retried) is not purged: without it the
# dependent could never be released nor failed.
STILL_AWAITED = f"""(status IN ({quoted(T.FAILED)}, {quoted(T.CANCELLED)}) AND has_dependents
    AND EXISTS (
    SELECT 1 FROM work_item_dependencies AS e
    JOIN work_items AS dependent ON dependent.work_item_id = e.dependent_id
    WHERE e.dependency_id = work_items.work_item_id
      AND dependent.status IN ({quoted(T.PENDING)}, {quoted(T.IN_PROGRESS)})))"""

# A finished item holding its task's resume point (the newest `iteration_end`,
# what `resume_state()` returns) is not purged while another item of that task
# is unfinished: that item resumes from it, and without it would start over.
# Detaching the checkpoint instead is not possible (checkpoints are append-only:
# migration 0002's trigger refuses any UPDATE), so the item waits for a later
# purge, once its sibling has finished or written a newer resume point. (An
# item's checkpoints are filed under its own task: `create_checkpoint` refuses
# another.)
HOLDS_RESUME_POINT = f"""(EXISTS (
    SELECT 1 FROM work_items AS sibling
    WHERE sibling.task_id = work_items.task_id
      AND sibling.status IN ({quoted(T.PENDING)}, {quoted(T.IN_PROGRESS)}))
    AND EXISTS (
    SELECT 1 FROM checkpoints AS c
    WHERE c.work_item_id = work_items.work_item_id AND {resume_point("c")}))"""


def _holds_period_key(d: Storage) -> str:
    """A finished item whose period key is still held (`unique_while=timedelta`): the
    key is held for its period whatever the item's status, by the row itself, so
    purging it would let a duplicate in before the period ends.

    Not a schedule's tick: its key (held for `UNIQUE_FOR`, 400 days) only backs up
    the schedule's own compare-and-swap of `next_run_at`, which never moves back by
    itself; kept for it, every tick's item would outlive any purge by a year.
    """
    held = (
        f"unique_scope = {quoted(UniqueScope.PERIOD.value)} AND unique_until > {d.now} "
        f"AND unique_key NOT LIKE '{TICK_KEY_PREFIX}%%'"
    )
    return f"COALESCE({held}, FALSE)"  # NULL (no key) must not read as held


def _finished_before(d: Storage, statuses: list[str], age_seconds: float) -> Statement:
    status_sql, status_params = d.in_list("status", statuses)
    return (
        f"{status_sql} AND completed_at < {d.clock()} AND NOT {STILL_AWAITED}"
        f" AND NOT {_holds_period_key(d)} AND NOT {HOLDS_RESUME_POINT}",
        [*status_params, d.offset(-age_seconds)],
    )


def count_finished(d: Storage, statuses: list[str], age_seconds: float) -> Statement:
    where, params = _finished_before(d, statuses, age_seconds)
    return f"SELECT COUNT(*) AS n FROM work_items WHERE {where}", params


def pick_finished(d: Storage, statuses: list[str], age_seconds: float, limit: int) -> Statement:
    """Up to `limit` finished items older than the age (locked on PostgreSQL).

    Locked, an item gains no new dependent until the purge commits (an enqueue
    locks the items it depends on), so what `STILL_AWAITED` saw holds.
    (`HOLDS_RESUME_POINT` is judged here too: a sibling enqueued or retried
    between this pick and the delete, a moment later, is not seen.)
    """
    where, params = _finished_before(d, statuses, age_seconds)
    lock = d.skip_locked()
    sql = f"SELECT work_item_id FROM work_items WHERE {where} LIMIT %s {lock}"
    return sql, [*params, limit]


def delete_items(d: Storage, item_ids: list[str]) -> list[Statement]:
    """Delete these items (as picked: none holds a resume point another item still
    needs) and what depends on them: their checkpoints and dependency edges go,
    idempotency keys stay (their cached responses outlive the item) and lose the link.

    The dependent rows are handled here rather than by the foreign keys' ON
    DELETE, which only Django 6.1 declares.
    """
    ids_sql, ids_params = d.in_list("work_item_id", item_ids)
    dependency_sql, dependency_params = d.in_list("dependency_id", item_ids)
    dependent_sql, dependent_params = d.in_list("dependent_id", item_ids)
    return [
        (
            f"DELETE FROM work_item_dependencies WHERE {dependency_sql} OR {dependent_sql}",
            [*dependency_params, *dependent_params],
        ),
        (f"DELETE FROM checkpoints WHERE {ids_sql}", ids_params),
        (f"UPDATE idempotency_keys SET work_item_id = NULL WHERE {ids_sql}", ids_params),
        (
            f"DELETE FROM work_items WHERE {ids_sql} AND {T.PURGE.leaves()} RETURNING work_item_id",
            ids_params,
        ),
    ]
