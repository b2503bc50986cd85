"""Carrying an item's end to the items that depend on it.

Every place that ends an item (a completion, the end of a failed attempt, the
sweep's recovery, an operator's force-fail) runs its plain statement, which
leaves alone an item flagged `has_dependents`; such an item is ended by
`finish_with_dependents()` instead, which ends it and settles its dependents
in one transaction. The sweep and the operator actions already run in a
transaction of their own and call `settle()` directly. Why the row is ended
before its edges are read, each in its own statement, is explained in
`leasing.sql.dependencies`.

`waiting_on()` and `dependents_of()` are what the console shows of an item's
dependencies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Case, Value, When

from .. import validation
from ..exceptions import WorkItemNotFound
from ..sql import dependencies as sql
from ..sql.runner import Statement, run, run_one
from ..states import WorkItemStatus
from ..storage import storage_for


def finish_with_dependents(using: str, statement: Statement) -> dict[str, Any] | None:
    """Run a fenced ending that also takes items with dependents (`plain=False`), and
    settle the dependents in the same transaction. Returns the ending's row (None: lost)."""
    with transaction.atomic(using=using, savepoint=False):
        row = run_one(using, statement)
        if row is not None and row.get("has_dependents"):
            settle(
                using,
                completed=[row["work_item_id"]] if _completed(row) else [],
                failed=[row["work_item_id"]] if _failed(row) else [],
            )
    return row


def _completed(row: dict[str, Any]) -> bool:
    status: str = row["status"]
    return status == WorkItemStatus.COMPLETED


def _failed(row: dict[str, Any]) -> bool:
    """Ended without completing: its dependents follow their `on_dependency_failure`."""
    status: str = row["status"]
    return status in (WorkItemStatus.FAILED, WorkItemStatus.CANCELLED)


def settle(using: str, *, completed: Iterable[str] = (), failed: Iterable[str] = ()) -> list[str]:
    """These items (locked by this transaction) just completed or failed for good:
    release or fail their dependents. Returns the ids of the dependents it failed."""
    completed, failed = sorted(set(completed)), sorted(set(failed))
    if completed:
        release_dependents(using, completed)
    return fail_dependents(using, failed) if failed else []


def release_dependents(using: str, completed: list[str]) -> None:
    """Count completed items off their dependents; wake workers for those now claimable."""
    d = storage_for(using)
    d.lock_dependents(completed)
    rows = run(using, sql.release(d, completed))
    d.notify(
        row["queue_name"]
        for row in rows
        if row["status"] == WorkItemStatus.PENDING and row["dependencies_left"] == 0
    )


def fail_dependents(using: str, failed: list[str]) -> list[str]:
    """Fail the pending dependents (that chose `fail`) of failed items, and theirs in turn.

    One statement per level of the graph: each level's rows are locked by the
    statement that failed them before the next one reads their edges.
    """
    d = storage_for(using)
    level, failed_now = failed, []
    while level:
        d.lock_dependents(level)
        rows = run(using, sql.fail_step(d, level))
        failed_now += [row["work_item_id"] for row in rows]
        level = sorted(row["work_item_id"] for row in rows if row["has_dependents"])
    return failed_now


def ended_dependencies(using: str, item_id: str) -> list[tuple[str, str]]:
    """The failed or cancelled dependencies of an item, as (id, status), all of them
    share-locked.

    Called before the item itself is locked (dependencies before dependents).
    """
    d = storage_for(using)
    rows = run(using, sql.share_lock_dependencies(d, item_id))
    ended = (WorkItemStatus.FAILED, WorkItemStatus.CANCELLED)
    return [(row["work_item_id"], row["status"]) for row in rows if row["status"] in ended]


def how_it_ended(status: str) -> str:
    """How a dependency that will not complete ended, for a message: an operator
    looks for a cancellation elsewhere than for a failure."""
    return "was cancelled" if status == WorkItemStatus.CANCELLED else "failed"


def failed_with_dependencies(using: str, item_id: str) -> int:
    """How many of the item's dependents failed with their dependencies (and stay failed
    until an operator retries each of them)."""
    row = run_one(using, sql.count_failed_with_dependencies(storage_for(using), item_id))
    return int(row["n"]) if row else 0


def dependencies_first(item_ids: Iterable[str], *, using: str = "default") -> list[str]:
    """These items, each after those of its dependencies that are among them (otherwise
    in the order given): the order an operator's retry of many items takes, so that an
    item that fails with its dependencies is not refused for a dependency retried later
    in the same action."""
    from ..models import WorkItemDependency

    ids = list(dict.fromkeys(item_ids))
    if len(ids) < 2:
        return ids
    edges = (
        WorkItemDependency.objects.using(using)
        .filter(dependent__in=ids, dependency__in=ids)
        .values_list("dependent_id", "dependency_id")
    )
    needs: dict[str, list[str]] = {}
    for dependent, dependency in edges:
        needs.setdefault(dependent, []).append(dependency)
    if not needs:
        return ids
    order: list[str] = []
    seen: set[str] = set()
    for start in ids:
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(needs.get(start, ())))]
        while stack:
            node, rest = stack[-1]
            nxt = next(rest, None)
            if nxt is None:
                order.append(node)
                stack.pop()
            elif nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, iter(needs.get(nxt, ()))))
    return order


# --- reads for the console ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Linked:
    """An item at the other end of an edge, as the console lists it."""

    work_item_id: str
    task_id: str
    work_type: str
    status: str


@dataclass(frozen=True, slots=True)
class WaitingOn:
    """What an item waits for.

    `left` is its counter (dependencies not completed); `blocked`: it is
    pending and `left` > 0, so no worker can claim it. `items` lists up to
    `limit` of its `total` dependencies, the unfinished ones first (failed or
    cancelled, in progress, pending), then the completed ones, each group by id.
    """

    work_item_id: str
    status: str
    left: int
    blocked: bool
    on_failure: str | None
    total: int
    items: tuple[Linked, ...]

    @property
    def failed(self) -> tuple[Linked, ...]:
        """The listed dependencies that failed or were cancelled: they will not complete
        unless an operator retries them (what keeps a `wait` item blocked)."""
        ended = (WorkItemStatus.FAILED, WorkItemStatus.CANCELLED)
        return tuple(i for i in self.items if i.status in ended)


@dataclass(frozen=True, slots=True)
class Dependents:
    """The items that wait for one item: `total`, and up to `limit` of them by id."""

    work_item_id: str
    total: int
    items: tuple[Linked, ...]


# Unfinished dependencies first: they are what the item waits for. A cancelled one
# will not complete either (as a failed one): never listed among the completed.
_UNFINISHED_FIRST = Case(
    When(status__in=(WorkItemStatus.FAILED, WorkItemStatus.CANCELLED), then=Value(0)),
    When(status=WorkItemStatus.IN_PROGRESS, then=Value(1)),
    When(status=WorkItemStatus.PENDING, then=Value(2)),
    default=Value(3),
)


def waiting_on(item_id: str, *, limit: int = 50, using: str = "default") -> WaitingOn:
    """What `item_id` waits for (raises `WorkItemNotFound` for an unknown id)."""
    using = validation.database_alias(using)
    from ..models import WorkItem  # models load only after django.setup()

    item = _item(item_id, using)
    links = WorkItem.objects.using(using).filter(dependent_links__dependent=item.pk)
    listed = links.annotate(rank=_UNFINISHED_FIRST).order_by("rank", "work_item_id")
    return WaitingOn(
        work_item_id=item.pk,
        status=item.status,
        left=item.dependencies_left,
        blocked=item.status == WorkItemStatus.PENDING and item.dependencies_left > 0,
        on_failure=item.on_dependency_failure,
        total=links.count(),
        items=_linked(listed, limit),
    )


def dependents_of(item_id: str, *, limit: int = 50, using: str = "default") -> Dependents:
    """The items that wait for `item_id` (raises `WorkItemNotFound` for an unknown id)."""
    using = validation.database_alias(using)
    from ..models import WorkItem

    item = _item(item_id, using)
    links = WorkItem.objects.using(using).filter(dependency_links__dependency=item.pk)
    return Dependents(item.pk, links.count(), _linked(links.order_by("work_item_id"), limit))


def _item(item_id: str, using: str) -> Any:
    from ..models import WorkItem

    item_id = validation.non_empty_text("work_item_id", item_id)
    item = (
        WorkItem.objects.using(using)
        .only("status", "dependencies_left", "on_dependency_failure")
        .filter(pk=item_id)
        .first()
    )
    if item is None:
        raise WorkItemNotFound(item_id)
    return item


def _linked(items: Any, limit: int) -> tuple[Linked, ...]:
    limit = validation.integer("limit", limit, minimum=0, maximum=10_000)
    rows = items.values_list("work_item_id", "task_id", "work_type", "status")[:limit]
    return tuple(Linked(*row) for row in rows)
