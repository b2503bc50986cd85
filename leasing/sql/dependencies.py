"""Statements of dependencies between work items.

An edge (`work_item_dependencies`) says its dependent is not claimable until
its dependency completed. The dependent counts its edges whose dependency has
not completed in `dependencies_left`, and the claim index holds only items at
0, so claiming never reads an edge. The counter changes in three places:

* at enqueue, it starts at the number of dependencies not completed;
* when a dependency completes, each dependent's counter goes down by its
  edges to it (`release`);
* when a dependency fails for good, its pending dependents that chose
  `fail` fail with "dependency failed: <id>" (`fail_step`), level by level.

Only items flagged `has_dependents` take the last two steps, so completing or
failing an item nobody waits for costs nothing extra.

Why the steps are separate statements (PostgreSQL, READ COMMITTED): an
enqueue locks its dependencies (`lock_items`) and flags them before it
inserts its edges, and a statement sees only what committed before it
started. So whoever ends an item with dependents first locks its row (the
UPDATE that completes or fails it), and only then, in a new statement, reads
its edges: every edge committed before the lock is visible, and an enqueue
that comes later waits for the lock and then sees the item finished.
Dependents are row-locked in id order before they change, as every locker of
several items does, so two transactions never wait for each other in a
cycle; a transaction always locks dependencies before their dependents.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import transitions as T
from ..states import DependencyFailure
from .runner import Statement

if TYPE_CHECKING:
    from ..storage.base import Storage


EDGES = "work_item_dependencies"
FAILURE_PREFIX = "dependency failed: "
_FAIL = f"'{DependencyFailure.FAIL.value}'"


def lock_items(d: Storage, ids: list[str]) -> Statement:
    """The status of each of these items, row-locked in id order until commit (PostgreSQL)."""
    where, params = d.one_of("work_item_id", ids)
    sql = f"""
        SELECT work_item_id, status, has_dependents FROM work_items
        WHERE {where} ORDER BY work_item_id {d.row_lock("NO KEY UPDATE")}
    """
    return sql, params


def mark_has_dependents(d: Storage, ids: list[str]) -> Statement:
    """Flag items that something now depends on (lock them first)."""
    where, params = d.one_of("work_item_id", ids)
    sql = f"""
        UPDATE work_items SET has_dependents = TRUE, updated_at = {d.now}
        WHERE {where} AND NOT has_dependents
    """
    return sql, params


def insert_edges(d: Storage, edges: list[tuple[str, str]]) -> Statement:
    """Insert (dependency, dependent) edges."""
    source, params = d.rows_table("e", [("a", "text"), ("b", "text")], edges)
    sql = f"INSERT INTO {EDGES} (dependency_id, dependent_id) SELECT e.a, e.b FROM {source}"
    return sql, params


def settle_new(d: Storage, rows: list[tuple[str, int, str | None]]) -> Statement:
    """Set new items' counters, failing those given a message: (id, dependencies_left, message)."""
    source, params = d.rows_table("v", [("id", "text"), ("n", "int"), ("message", "text")], rows)
    sql = f"""
        UPDATE work_items AS w
        SET dependencies_left = v.n,
            {T.DEPENDENCY_FAILED.sets_if("v.message IS NOT NULL", row="w")},
            error_message = COALESCE(v.message, w.error_message),
            completed_at = CASE WHEN v.message IS NULL THEN w.completed_at ELSE {d.now} END,
            updated_at = {d.now}
        FROM {source}
        WHERE w.work_item_id = v.id
    """
    return sql, params


def _per_dependent(d: Storage, ids: list[str]) -> Statement:
    """`c(dependent_id, n, cause)`: dependents of these items, their edges to them, one of them."""
    where, params = d.one_of("dependency_id", ids)
    sql = f"""(
        SELECT dependent_id, count(*) AS n, min(dependency_id) AS cause
        FROM {EDGES} WHERE {where} GROUP BY dependent_id
    ) AS c"""
    return sql, params


def release(d: Storage, completed: list[str]) -> Statement:
    """These items completed: count them off their dependents' `dependencies_left`.

    Every dependent is counted off, whatever its status, so the counter stays
    the number of dependencies not completed (an operator may retry a failed
    dependent later). Returns the dependents with their new counters.
    """
    source, params = _per_dependent(d, completed)
    sql = f"""
        UPDATE work_items AS w
        SET dependencies_left = w.dependencies_left - c.n, updated_at = {d.now}
        FROM {source}
        WHERE w.work_item_id = c.dependent_id
        RETURNING work_item_id, status, dependencies_left, queue_name
    """
    return sql, params


def fail_step(d: Storage, failed: list[str]) -> Statement:
    """These items failed for good: fail their pending dependents that chose `fail`.

    Returns the items it failed (whose own dependents are the next step).
    """
    source, params = _per_dependent(d, failed)
    sql = f"""
        UPDATE work_items AS w
        SET {T.DEPENDENCY_FAILED.sets()}, error_message = %s || c.cause,
            completed_at = {d.now}, updated_at = {d.now}
        FROM {source}
        WHERE w.work_item_id = c.dependent_id
          AND {T.DEPENDENCY_FAILED.leaves("w")} AND w.on_dependency_failure = {_FAIL}
        RETURNING work_item_id, has_dependents
    """
    return sql, [FAILURE_PREFIX, *params]


def count_failed_with_dependencies(d: Storage, item_id: str) -> Statement:
    """How many of the item's dependents failed with their dependencies (`n`).

    They stay failed when the item is retried: each one is retried on its own,
    and then waits for its dependencies again.
    """
    sql = f"""
        SELECT COUNT(*) AS n FROM {EDGES} AS e
        JOIN work_items AS w ON w.work_item_id = e.dependent_id
        WHERE e.dependency_id = %s AND w.status = {T.quoted(T.FAILED)}
          AND w.error_message LIKE %s
    """
    return sql, [item_id, FAILURE_PREFIX + "%"]


def share_lock_dependencies(d: Storage, item_id: str) -> Statement:
    """The dependencies of an item and their status, share-locked in id order (PostgreSQL).

    An operator's retry reads them before it locks the item itself: a
    dependency cannot fail between the check and the retry's commit.
    """
    sql = f"""
        SELECT work_item_id, status FROM work_items
        WHERE work_item_id IN (SELECT dependency_id FROM {EDGES} WHERE dependent_id = %s)
        ORDER BY work_item_id {d.row_lock("SHARE")}
    """
    return sql, [item_id]
