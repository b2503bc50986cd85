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

from typing import Any

from .. import transitions as T
from ..states import DependencyFailure
from .dialect import Dialect
from .runner import Statement
from .unique import json_list

EDGES = "work_item_dependencies"
FAILURE_PREFIX = "dependency failed: "
_FAIL = f"'{DependencyFailure.FAIL.value}'"


def _ids(d: Dialect, column: str, ids: list[str]) -> Statement:
    """`column` is one of `ids`, with one parameter whatever their number."""
    if d.is_postgres:
        return f"{column} = ANY(%s::text[])", [list(ids)]
    return f"{column} IN (SELECT value FROM json_each(%s))", [json_list(list(ids))]


def lock_items(d: Dialect, ids: list[str]) -> Statement:
    """The status of each of these items, row-locked in id order until commit (PostgreSQL)."""
    where, params = _ids(d, "work_item_id", ids)
    lock = "FOR NO KEY UPDATE" if d.is_postgres else ""
    sql = f"""
        SELECT work_item_id, status, has_dependents FROM work_items
        WHERE {where} ORDER BY work_item_id {lock}
    """
    return sql, params


def mark_has_dependents(d: Dialect, ids: list[str]) -> Statement:
    """Flag items that something now depends on (lock them first)."""
    where, params = _ids(d, "work_item_id", ids)
    sql = f"""
        UPDATE work_items SET has_dependents = TRUE, updated_at = {d.now}
        WHERE {where} AND NOT has_dependents
    """
    return sql, params


def insert_edges(d: Dialect, edges: list[tuple[str, str]]) -> Statement:
    """Insert (dependency, dependent) edges."""
    if d.is_postgres:
        sql = f"""
            INSERT INTO {EDGES} (dependency_id, dependent_id)
            SELECT * FROM unnest(%s::text[], %s::text[])
        """
        return sql, [[a for a, _ in edges], [b for _, b in edges]]
    sql = f"""
        INSERT INTO {EDGES} (dependency_id, dependent_id)
        SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(%s)
    """
    return sql, [json_list([list(edge) for edge in edges])]


def settle_new(d: Dialect, rows: list[tuple[str, int, str | None]]) -> Statement:
    """Set new items' counters, failing those given a message: (id, dependencies_left, message)."""
    if d.is_postgres:
        source = "unnest(%s::text[], %s::int[], %s::text[]) AS v(id, n, message)"
        params: list[Any] = [[r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]]
    else:
        source = """(SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS n,
                            json_extract(value, '$[2]') AS message FROM json_each(%s)) AS v"""
        params = [json_list([list(r) for r in rows])]
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


def lock_dependents(d: Dialect, ids: list[str]) -> Statement:
    """PostgreSQL: row-lock the dependents of these items, in id order."""
    where, params = _ids(d, "dependency_id", ids)
    sql = f"""
        SELECT work_item_id FROM work_items
        WHERE work_item_id IN (SELECT dependent_id FROM {EDGES} WHERE {where})
        ORDER BY work_item_id
        FOR NO KEY UPDATE
    """
    return sql, params


def _per_dependent(d: Dialect, ids: list[str]) -> Statement:
    """`c(dependent_id, n, cause)`: dependents of these items, their edges to them, one of them."""
    where, params = _ids(d, "dependency_id", ids)
    sql = f"""(
        SELECT dependent_id, count(*) AS n, min(dependency_id) AS cause
        FROM {EDGES} WHERE {where} GROUP BY dependent_id
    ) AS c"""
    return sql, params


def release(d: Dialect, completed: list[str]) -> Statement:
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


def fail_step(d: Dialect, failed: list[str]) -> Statement:
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


def share_lock_dependencies(d: Dialect, item_id: str) -> Statement:
    """The dependencies of an item and their status, share-locked in id order (PostgreSQL).

    An operator's retry reads them before it locks the item itself: a
    dependency cannot fail between the check and the retry's commit.
    """
    lock = "FOR SHARE" if d.is_postgres else ""
    sql = f"""
        SELECT work_item_id, status FROM work_items
        WHERE work_item_id IN (SELECT dependency_id FROM {EDGES} WHERE dependent_id = %s)
        ORDER BY work_item_id {lock}
    """
    return sql, [item_id]
