"""Statements of unique enqueue: insert unless the key is held, and find its holder.

An item holds its `(unique_key, unique_scope)` while its scope says so:

* `pending`: while it is pending;
* `unfinished`: while it is pending or in progress;
* `period`: until `unique_until` (its enqueue time plus the period), whatever
  its status.

The two status scopes are enforced by the partial unique index
`work_items_unique_key_uniq`, whose predicate is `HOLDING` below: the INSERT
says `ON CONFLICT (unique_key, unique_scope) WHERE <HOLDING> DO NOTHING`, so
a duplicate is skipped inside the statement, whatever runs concurrently.
SQLite matches a partial index to the conflict target by comparing the two
WHERE clauses term by term, so `HOLDING` is written exactly as Django renders
the model's condition (same terms, same order).

A period cannot be a partial index: "until a time" depends on the clock, and
an index predicate cannot. On PostgreSQL the enqueue takes a
transaction-scoped advisory lock on each period key (`Storage.lock_period_keys`), in
a statement of its own and in sorted order, then looks for a holder and
inserts only if there is none: two enqueues of one key serialize on the lock,
and the second one's lookup (a new statement, so a new snapshot) sees the
first one's row once it committed. On SQLite the IMMEDIATE transaction holds
the database's only write lock for the same span.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..states import UniqueScope
from ..transitions import IN_PROGRESS, PENDING, quoted
from .runner import Statement, is_unique_violation

if TYPE_CHECKING:
    from ..storage.base import Storage


_P, _U = f"'{UniqueScope.PENDING.value}'", f"'{UniqueScope.UNFINISHED.value}'"
PERIOD = f"'{UniqueScope.PERIOD.value}'"
# The scopes a status holds (one holder per key, the unique index): SQL list.
STATUS_SCOPES = f"{_P}, {_U}"


def holding(row: str = "") -> str:
    """The predicate of work_items_unique_key_uniq (see the module docstring)."""
    p = f"{row}." if row else ""
    return (
        f"(({p}unique_scope = {_P} AND {p}status = {quoted(PENDING)}) "
        f"OR ({p}unique_scope = {_U} AND {p}status IN ({quoted(PENDING)}, {quoted(IN_PROGRESS)})))"
    )


ON_CONFLICT = f"ON CONFLICT (unique_key, unique_scope) WHERE {holding()} DO NOTHING"
# The index behind ON_CONFLICT: a statement that puts an item back to pending
# can still meet it when a concurrent enqueue inserted a holder of the same key
# after the statement looked (PostgreSQL); it is run again and then sees it.
INDEX = "work_items_unique_key_uniq"


def raced(exc: BaseException) -> bool:
    """A statement met a holder of a unique key committed after it looked: run it again."""
    return is_unique_violation(exc, INDEX, "work_items.unique_key, work_items.unique_scope")


def other_holder(row: str) -> str:
    """SQL: the id of another item that holds `row`'s status-scoped key now, else NULL.

    What every transition back to pending asks before it returns an item
    there (`leasing.transitions`: the returning item is superseded by the
    holder). A period key is not checked: its holders overlap by design.
    """
    return f"""(CASE WHEN {row}.unique_scope IN ({STATUS_SCOPES}) THEN (
        SELECT h.work_item_id FROM work_items AS h
        WHERE h.unique_key = {row}.unique_key AND h.unique_scope = {row}.unique_scope
          AND h.work_item_id <> {row}.work_item_id AND {holding("h")}
        LIMIT 1) END)"""


def superseded_message(holder: str, error: str) -> str:
    """SQL: the error message of an item superseded by `holder` (both SQL expressions)."""
    return (
        f"'Superseded by ' || {holder} || ', which holds its unique key; ' || COALESCE({error}, '')"
    )


def holders(d: Storage, keys: list[str], scope: str, columns: str) -> Statement:
    """The `columns` of the item holding each of these keys of one scope now (a key
    not held: no row).

    A status scope has at most one holder per key (the unique index); a
    period can have several after the period was changed: the newest wins.
    """
    if scope == UniqueScope.PERIOD:
        held = f"w.unique_scope = {PERIOD} AND w.unique_until > {d.now}"
        params: list[Any] = []
    else:
        held = f"w.unique_scope = %s AND {holding('w')}"
        params = [scope]
    keys_sql, key_params = d.keys_table("h", keys)
    sql = f"""
        SELECT {columns} FROM work_items
        WHERE work_item_id IN (
            SELECT (SELECT w.work_item_id FROM work_items AS w
                    WHERE w.unique_key = h.key AND {held}
                    ORDER BY w.created_at DESC, w.work_item_id DESC
                    LIMIT 1)
            FROM {keys_sql}
        )
    """
    return sql, [*params, *key_params]


def json_list(values: list[Any]) -> str:
    """A list as one JSON parameter (SQLite reads it with json_each)."""
    return json.dumps(values, separators=(",", ":"))
