"""Enqueueing items with a unique key or dependencies.

`enqueue_many()` sends a batch here, validated (`leasing.services.enqueue_rules`),
when one of its items has a `unique_key` or `depends_on`; a plain batch never
comes here. Everything
happens in the caller's transaction, in this order (the order every enqueue
takes its locks in, so two enqueues never wait for each other in a cycle):

1. Within the batch, a later item with the key and scope of an earlier one is
   a duplicate of it.
2. The items named in `depends_on` are row-locked in id order, flagged
   `has_dependents` and their status read; an unknown id refuses the batch.
3. Period-scoped keys are locked (PostgreSQL: advisory locks) and their
   current holders looked up.
4. The other items are inserted in one statement whose ON CONFLICT skips a
   row whose status-scoped key is held; the holders of the skipped keys are
   looked up (a holder that stopped holding in between: the row is inserted
   again).
5. Each item's dependencies are resolved (a position in the batch becomes the
   id of the item inserted there, or of the item its key found), new items'
   counters set, items depending on a failed item with `fail` failed at once,
   and the edges inserted.

A dependency cycle, an unknown id or a bad position raises `InvalidInput`;
the transaction is rolled back, so nothing is written.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..exceptions import InvalidInput, LeasingError, UnknownDependency
from ..sql import dependencies as deps_sql
from ..sql import unique as unique_sql
from ..sql.new_items import NewItem, RichRow
from ..sql.runner import run
from ..states import DependencyFailure, UniqueScope, WorkItemStatus
from ..storage import storage_for
from .enqueue_rules import find_cycle

if TYPE_CHECKING:
    from ..models import WorkItem

# A held key whose holder stops holding it before it is looked up is inserted
# again; this many times in a row means something is wrong.
MAX_INSERT_ROUNDS = 5

# A dependency in one of these will never complete (unless an operator retries it).
ENDED_UNCOMPLETED = (WorkItemStatus.FAILED, WorkItemStatus.CANCELLED)


# --- inserting ------------------------------------------------------------------------------


class _Batch:
    """A batch on its way in: which position became which row."""

    def __init__(self, using: str, items: list[NewItem]) -> None:
        self.using = using
        self.d = storage_for(using)
        self.items = items
        # A later item with the key and scope of an earlier one is its duplicate.
        self.alias: dict[int, int] = {}
        first: dict[tuple[str, str | None], int] = {}
        for index, item in enumerate(items):
            if item.unique_key is not None:
                key = (item.unique_key, item.unique_scope)
                self.alias[index] = first.setdefault(key, index)
        self.alias = {i: f for i, f in self.alias.items() if i != f}
        self.existing: dict[int, str] = {}  # position -> the item holding its key
        self.status: dict[str, str] = {}  # existing dependency -> its status
        self.locked: set[str] = set()
        self.columns = _columns()
        self.rows: dict[str, dict[str, Any]] = {}  # inserted rows and holders, by id

    def own(self, index: int) -> int:
        """The position whose row stands for `index` (itself unless a duplicate in the batch)."""
        return self.alias.get(index, index)

    def row_id(self, index: int) -> str:
        index = self.own(index)
        return self.existing.get(index) or self.items[index].work_item_id

    def is_new(self, index: int) -> bool:
        return index not in self.alias and index not in self.existing


def insert_with_rules(using: str, items: list[NewItem]) -> list[WorkItem]:
    """Insert a batch with unique keys or dependencies (inside the caller's transaction)."""
    batch = _Batch(using, items)
    # Every id is checked, even those of an item that turns out a duplicate.
    external = sorted({dep for item in items for dep in item.depends_on if isinstance(dep, str)})
    _lock_dependencies(batch, external)
    _find_period_holders(batch)
    _insert_rows(batch)
    states = _settle(batch)
    batch.d.notify(
        items[i].queue_name for i, (left, failed) in states.items() if not left and not failed
    )
    return _returned(batch)


def _lock_dependencies(batch: _Batch, ids: list[str]) -> None:
    """Lock and flag existing items that new items depend on; learn their status."""
    ids = [i for i in ids if i not in batch.locked]
    if not ids:
        return
    rows = run(batch.using, deps_sql.lock_items(batch.d, ids))
    found = {row["work_item_id"]: row for row in rows}
    missing = [i for i in ids if i not in found]
    if missing:
        shown = ", ".join(repr(i) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise UnknownDependency(f"depends_on: no work item with id {shown}.")
    batch.locked.update(ids)
    batch.status.update({i: row["status"] for i, row in found.items()})
    unflagged = [i for i, row in found.items() if not row["has_dependents"]]
    if unflagged:
        run(batch.using, deps_sql.mark_has_dependents(batch.d, unflagged))


def _find_period_holders(batch: _Batch) -> None:
    period = {
        _unique(item)[0]: index
        for index, item in enumerate(batch.items)
        if item.unique_scope == UniqueScope.PERIOD and index not in batch.alias
    }
    if not period:
        return
    batch.d.lock_period_keys(list(period))
    _holders(batch, period, UniqueScope.PERIOD)


def _unique(item: NewItem) -> tuple[str, str]:
    """The unique key and scope of an item that has them (`item_rules` sets both or neither)."""
    assert item.unique_key is not None and item.unique_scope is not None
    return item.unique_key, item.unique_scope


def _holders(batch: _Batch, positions: dict[str, int], scope: str) -> None:
    """Look up the holders of these keys (key -> position) of one scope."""
    statement = unique_sql.holders(batch.d, sorted(positions), scope, batch.columns)
    for row in run(batch.using, statement):
        batch.existing[positions[row["unique_key"]]] = row["work_item_id"]
        batch.rows[row["work_item_id"]] = row


def _insert_rows(batch: _Batch) -> None:
    """Insert the new rows; a row whose status-scoped key is held resolves to its holder."""
    items = batch.items
    # Positions something in the batch depends on (through duplicates to their first).
    depended = {batch.own(dep) for item in items for dep in item.depends_on if type(dep) is int}
    todo = [i for i in range(len(items)) if batch.is_new(i)]
    for _ in range(MAX_INSERT_ROUNDS):
        rows = [RichRow(items[i], _provisional(batch, i), i in depended) for i in todo]
        inserted = _insert(batch, rows)
        skipped = [i for i in todo if items[i].work_item_id not in inserted]
        if not skipped:
            return
        # Only a held unique key makes the insert skip a row.
        for scope in {_unique(items[i])[1] for i in skipped}:
            keys = {_unique(items[i])[0]: i for i in skipped if items[i].unique_scope == scope}
            _holders(batch, keys, scope)
        todo = [i for i in skipped if i not in batch.existing]
        if not todo:
            return
    raise LeasingError(
        "unique enqueue: the holders of these keys kept finishing while they were looked "
        "up; try again."
    )


def _provisional(batch: _Batch, index: int) -> int:
    """Dependencies not completed, counting every dependency in the batch (settled later)."""
    left: set[str | int] = set()
    for dep in batch.items[index].depends_on:
        if isinstance(dep, str):
            if batch.status[dep] != WorkItemStatus.COMPLETED:
                left.add(dep)
        else:
            left.add(batch.own(dep))
    return len(left)


def _insert(batch: _Batch, rows: list[RichRow]) -> set[str]:
    """Insert rows, skipping held keys; the ids of the rows inserted."""
    statements = batch.d.insert_rich(rows, unique_sql.ON_CONFLICT, batch.columns)
    inserted: set[str] = set()
    for statement in statements:
        for row in run(batch.using, statement):
            inserted.add(row["work_item_id"])
            batch.rows[row["work_item_id"]] = row
    return inserted


def _settle(batch: _Batch) -> dict[int, tuple[int, bool]]:
    """Resolve every new item's dependencies; set counters, fail early, insert edges.

    Returns each new item's (dependencies left, failed).
    """
    items, new = batch.items, [i for i in range(len(batch.items)) if batch.is_new(i)]
    needs: dict[int, list[str]] = {}
    for index in new:
        ids = dict.fromkeys(
            dep if isinstance(dep, str) else batch.row_id(dep) for dep in items[index].depends_on
        )
        needs[index] = list(ids)
    position_of = {items[i].work_item_id: i for i in new}
    graph = {i: [position_of[x] for x in ids if x in position_of] for i, ids in needs.items()}
    cycle = find_cycle(graph)
    if cycle:
        raise InvalidInput(
            "dependency cycle: items "
            + " -> ".join(map(str, cycle))
            + " (through an item whose unique key made it a duplicate)."
        )
    _lock_dependencies(batch, sorted({x for ids in needs.values() for x in ids} - set(position_of)))
    states: dict[int, tuple[int, bool]] = {}
    changes: list[tuple[str, int, str | None]] = []
    for index in _dependencies_first(graph, new):
        left, cause = 0, None
        for dep in needs[index]:
            status: str
            if dep in position_of:
                dep_failed = states[position_of[dep]][1]
                status = WorkItemStatus.FAILED if dep_failed else WorkItemStatus.PENDING
            else:
                status = batch.status[dep]
            if status != WorkItemStatus.COMPLETED:
                left += 1
            if status in ENDED_UNCOMPLETED and cause is None:
                cause = dep
        fails = cause is not None and items[index].on_dependency_failure == DependencyFailure.FAIL
        states[index] = (left, fails)
        if fails or left != _provisional(batch, index):
            message = deps_sql.FAILURE_PREFIX + cause if fails and cause else None
            changes.append((items[index].work_item_id, left, message))
    if changes:
        run(batch.using, deps_sql.settle_new(batch.d, changes))
    edges = [(dep, items[i].work_item_id) for i, ids in needs.items() for dep in ids]
    if edges:
        run(batch.using, deps_sql.insert_edges(batch.d, edges))
    return states


def _dependencies_first(graph: dict[int, list[int]], nodes: list[int]) -> list[int]:
    """The nodes, each after the nodes it depends on (the graph has no cycle)."""
    order: list[int] = []
    seen: set[int] = set()
    for start in nodes:
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(graph.get(start, ())))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                order.append(node)
                stack.pop()
            elif child not in seen:
                seen.add(child)
                stack.append((child, iter(graph.get(child, ()))))
    return order


def _returned(batch: _Batch) -> list[WorkItem]:
    """The batch's items in order: new ones, and the holders of duplicates.

    Built from the rows the INSERT and the holder lookups returned; a batch
    with dependencies changed rows since (counters, flags, early failures) and
    is read back.
    """
    from ..models import WorkItem  # models load only after django.setup()

    ids = [batch.row_id(i) for i in range(len(batch.items))]
    if any(item.depends_on for item in batch.items):
        rows = WorkItem.objects.using(batch.using).in_bulk(list(set(ids)))
    else:
        rows = _from_rows(batch.using, [batch.rows[i] for i in set(ids)])
    result: list[WorkItem] = []
    given: set[str] = set()
    for index, item_id in enumerate(ids):
        item = rows[item_id]
        if item_id in given:
            item = copy.copy(item)
        given.add(item_id)
        item.duplicate = not batch.is_new(index)
        result.append(item)
    return result


def _columns() -> str:
    from ..models import WorkItem

    # A concrete field is one that has a column.
    return ", ".join(f.column for f in WorkItem._meta.concrete_fields if f.column is not None)


def _from_rows(using: str, rows: list[dict[str, Any]]) -> dict[str, WorkItem]:
    """Model instances from raw rows, with the database's converters applied (as a query's
    results get them: SQLite's timestamps as text and booleans as integers, JSON text)."""
    from ..models import WorkItem

    connection = connections[using]
    fields = WorkItem._meta.concrete_fields
    table = WorkItem._meta.db_table
    converters = []
    for field in fields:
        assert field.column is not None  # a concrete field has a column
        col = field.get_col(table)
        convs = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
        converters.append((field.column, col, convs))
    names = [f.attname for f in fields]
    result = {}
    for row in rows:
        values = []
        for column, col, convs in converters:
            value = row[column]
            for convert in convs:
                value = convert(value, col, connection)
            values.append(value)
        instance = WorkItem.from_db(using, names, values)
        result[instance.work_item_id] = instance
    return result
