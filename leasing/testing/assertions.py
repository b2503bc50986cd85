"""What was enqueued: `enqueued()`, `assert_enqueued()`, `refute_enqueued()`.

The filters take the names of `enqueue()`'s arguments (`work_type`,
`task_id`, `input_data`, `queue_name`, `priority`, `max_retries`,
`unique_key`), so a test asserts an item with the words the code under test
enqueued it with. `input_data` matches a subset: a dict matches an item whose
input has those keys with equal values (recursively); anything else must be
equal. By default only pending items count (waiting to run: due, scheduled
for later, or blocked by dependencies); `status=None` counts every status.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db.models.functions import Now

from .. import validation
from ..states import WorkItemStatus

if TYPE_CHECKING:
    from ..models import WorkItem

# Items listed in a failure message, at most (the rest are counted).
SHOWN = 10

_FILTERS = ("work_type", "task_id", "queue_name", "priority", "max_retries", "unique_key")


def enqueued(
    work_type: str | None = None,
    *,
    task_id: str | None = None,
    input_data: Any = None,
    queue_name: str | None = None,
    priority: int | None = None,
    max_retries: int | None = None,
    unique_key: str | None = None,
    status: str | Iterable[str] | None = WorkItemStatus.PENDING,
    scheduled: bool | None = None,
    using: str = "default",
) -> list[WorkItem]:
    """The work items matching every filter given, in claim order (asserts nothing).

    `scheduled=True` keeps items not due yet (a `run_after` in the future,
    a retry's backoff included), `False` those due now; None either.
    """
    from ..models import WorkItem  # models load only after django.setup()

    using = validation.database_alias(using)
    fields = {
        "work_type": work_type,
        "task_id": task_id,
        "queue_name": queue_name,
        "priority": priority,
        "max_retries": max_retries,
        "unique_key": unique_key,
    }
    items = WorkItem.objects.using(using).filter(
        **{name: value for name, value in fields.items() if value is not None}
    )
    statuses = _statuses(status)
    if statuses is not None:
        items = items.with_status(*statuses)
    if scheduled is True:
        items = items.filter(run_after__gt=Now())
    elif scheduled is False:
        items = items.exclude(run_after__gt=Now())
    elif scheduled is not None:
        raise TypeError(f"scheduled must be True, False or None, got {scheduled!r}.")
    found = list(items.claim_order())
    if input_data is None:
        return found
    return [item for item in found if contains(item.input_data, input_data)]


def assert_enqueued(
    work_type: str | None = None, *, count: int | None = None, **filters: Any
) -> list[WorkItem]:
    """Assert that items match (exactly `count` of them, if given); return them.

    Takes `enqueued()`'s filters. Raises `AssertionError` naming what was
    looked for and listing the items there are instead.
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise TypeError(f"count must be a non-negative int, got {count!r}.")
    found = enqueued(work_type, **filters)
    if count is None and found:
        return found
    if count is not None and len(found) == count:
        return found
    wanted = _wanted(work_type, filters, plural=count not in (None, 1))
    if not found:
        raise AssertionError(
            f"Expected {_amount(count)} {wanted}; none matched.\n" + _others(work_type, filters)
        )
    raise AssertionError(
        f"Expected {_amount(count)} {wanted}; {len(found)} matched:\n" + _listing(found)
    )


def refute_enqueued(work_type: str | None = None, **filters: Any) -> None:
    """Assert that no item matches `enqueued()`'s filters; the message lists those that do."""
    found = enqueued(work_type, **filters)
    if found:
        raise AssertionError(
            f"Expected no {_wanted(work_type, filters)}; {len(found)} matched:\n" + _listing(found)
        )


def contains(actual: Any, expected: Any) -> bool:
    """`expected` is a subset of `actual`: dicts by key (recursively), anything else by equality."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            key in actual and contains(actual[key], value) for key, value in expected.items()
        )
    return bool(actual == expected)


def describe(item: WorkItem) -> str:
    """One line for a failure message."""
    line = (
        f"{item.work_item_id} {item.work_type} {item.status} task_id={item.task_id!r} "
        f"queue_name={item.queue_name!r} input_data={item.input_data!r}"
    )
    if item.priority:
        line += f" priority={item.priority}"
    if item.unique_key is not None:
        line += f" unique_key={item.unique_key!r}"
    if item.run_after is not None:
        line += f" run_after={item.run_after.isoformat()}"
    if item.dependencies_left:
        line += f" waiting on {item.dependencies_left} dependencies"
    return line


def _statuses(status: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if status is None:
        return None
    if isinstance(status, str):
        return (status,)
    return tuple(status)


def _amount(count: int | None) -> str:
    if count is None:
        return "a"
    return f"{count}" if count != 1 else "exactly 1"


def _wanted(work_type: str | None, filters: dict[str, Any], *, plural: bool = False) -> str:
    """What was looked for, in the caller's words."""
    noun = _noun(filters) + ("s" if plural else "")
    terms = [f"work_type={work_type!r}"] if work_type is not None else []
    terms += [f"{name}={filters[name]!r}" for name in _FILTERS if filters.get(name) is not None]
    if filters.get("input_data") is not None:
        terms.append(f"input_data containing {filters['input_data']!r}")
    if filters.get("scheduled") is not None:
        terms.append("scheduled for later" if filters["scheduled"] else "due now")
    if filters.get("using", "default") != "default":
        terms.append(f"in database {filters['using']!r}")
    return noun + (" with " + ", ".join(terms) if terms else "")


def _noun(filters: dict[str, Any]) -> str:
    statuses = _statuses(filters.get("status", WorkItemStatus.PENDING))
    return "work item" if statuses is None else f"{'/'.join(statuses)} work item"


def _others(work_type: str | None, filters: dict[str, Any]) -> str:
    """The items a reader would look at instead: same status (and work type, if any)."""
    near = {"status": filters.get("status", WorkItemStatus.PENDING)}
    if "using" in filters:
        near["using"] = filters["using"]
    noun = _noun(filters) + "s"
    same_type = enqueued(work_type, **near) if work_type is not None else []
    if same_type:
        return f"Instead, the {noun} of work type {work_type!r} are:\n" + _listing(same_type)
    everything = enqueued(**near)
    if not everything:
        return f"There are no {noun} at all."
    return f"Instead, the {noun} are:\n" + _listing(everything)


def _listing(items: list[WorkItem]) -> str:
    lines = [f"  {describe(item)}" for item in items[:SHOWN]]
    if len(items) > SHOWN:
        lines.append(f"  ... and {len(items) - SHOWN} more")
    return "\n".join(lines)
