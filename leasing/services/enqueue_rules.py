"""The unique and dependency arguments of `enqueue()` / `enqueue_many()`, validated.

`item_rules()` checks one item's `unique_key`, `unique_while`, `depends_on`
and `on_dependency_failure`; `check_positions()` checks that the batch
positions in `depends_on` name other items of the batch and form no cycle.
Nothing is written here; `leasing.services.enqueue_with_rules` inserts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from .. import validation
from ..exceptions import InvalidInput
from ..sql.new_items import NewItem
from ..states import DependencyFailure, UniqueScope

# One item may wait for this many others (fan-in).
MAX_DEPENDENCIES = 10_000


def item_rules(
    unique_key: Any, unique_while: Any, depends_on: Any, on_dependency_failure: Any
) -> dict[str, Any]:
    """The validated unique and dependency fields of one item, as `NewItem` keywords."""
    rules: dict[str, Any] = {}
    if unique_key is None:
        if unique_while is not None:
            raise InvalidInput("unique_while needs a unique_key.")
    else:
        rules["unique_key"] = validation.non_empty_text("unique_key", unique_key)
        rules["unique_scope"], rules["unique_seconds"] = _scope(unique_while)
    dependencies = _dependencies(depends_on)
    if dependencies:
        rules["depends_on"] = dependencies
        rules["on_dependency_failure"] = _on_failure(on_dependency_failure)
    elif on_dependency_failure is not None:
        raise InvalidInput("on_dependency_failure needs depends_on.")
    return rules


def _scope(unique_while: Any) -> tuple[str, float | None]:
    if unique_while is None:
        return UniqueScope.UNFINISHED.value, None
    if isinstance(unique_while, timedelta):
        seconds = validation.positive_seconds("unique_while", unique_while.total_seconds())
        return UniqueScope.PERIOD.value, seconds
    if isinstance(unique_while, str) and unique_while in (
        UniqueScope.PENDING,
        UniqueScope.UNFINISHED,
    ):
        return str(unique_while), None
    raise InvalidInput(
        f"unique_while must be 'pending', 'unfinished' or a timedelta, got {unique_while!r}."
    )


def _on_failure(value: Any) -> str:
    if value is None:
        return DependencyFailure.FAIL.value
    if isinstance(value, str) and value in DependencyFailure.values:
        return str(value)
    raise InvalidInput(f"on_dependency_failure must be 'fail' or 'wait', got {value!r}.")


def _dependencies(depends_on: Any) -> tuple[str | int, ...]:
    """Ids (work items given by themselves count as their ids) and batch positions,
    without repeats, in the order given."""
    if depends_on is None:
        return ()
    if isinstance(depends_on, str | bytes | Mapping) or not isinstance(depends_on, Iterable):
        raise InvalidInput(
            "depends_on must be a list of work item ids (or work items), "
            f"got {type(depends_on).__name__}."
        )
    found: dict[str | int, None] = {}
    for dep in depends_on:
        if type(dep) is int:
            if dep < 0:
                raise InvalidInput(f"depends_on: a batch position must be >= 0, got {dep}.")
            found[dep] = None
            continue
        if not isinstance(dep, str):
            dep = getattr(dep, "work_item_id", dep)
        if not isinstance(dep, str):
            raise InvalidInput(f"depends_on: expected a work item id, got {dep!r}.")
        found[validation.non_empty_text("depends_on", dep)] = None
        if len(found) > MAX_DEPENDENCIES:
            raise InvalidInput(
                f"depends_on names more than {MAX_DEPENDENCIES} work items; "
                "make an intermediate item wait for a part of them."
            )
    return tuple(found)


def check_positions(items: list[NewItem]) -> None:
    """Positions name other items of the batch, and positions form no cycle."""
    edges: dict[int, list[int]] = {}
    for index, item in enumerate(items):
        for dep in item.depends_on:
            if type(dep) is not int:
                continue
            if dep >= len(items):
                raise InvalidInput(
                    f"item {index}: depends_on position {dep} is not in the batch "
                    f"of {len(items)} items."
                )
            if dep == index:
                raise InvalidInput(f"item {index} depends on itself.")
            edges.setdefault(index, []).append(dep)
    cycle = find_cycle(edges)
    if cycle:
        raise InvalidInput("dependency cycle: items " + " -> ".join(map(str, cycle)) + ".")


def find_cycle(edges: Mapping[Any, Iterable[Any]]) -> list[Any]:
    """A cycle of the graph `node -> nodes it depends on` (closed: first == last), or []."""
    state: dict[Any, int] = {}  # 1: on the current path, 2: done
    for start in edges:
        if start in state:
            continue
        path: list[Any] = [start]
        stack = [iter(edges.get(start, ()))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(edges.get(nxt, ())))
    return []
