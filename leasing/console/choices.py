"""Work types and queues the work item list offers as filter choices.

A DISTINCT over millions of rows would cost more than the list itself, so the
choices come from cheap sources: the types with a handler, what workers
announce, and the values of in-progress items (read through their partial
index). Any other value still filters when typed into the URL.
"""

from __future__ import annotations

from ..handlers import registry
from ..models import Worker, WorkItem

WORKER_ROWS_READ = 500


def _announced(column: str, using: str) -> set[str]:
    """Strings listed in the JSON column `column` of the newest worker rows."""
    values: set[str] = set()
    for listed in Worker.objects.using(using).values_list(column, flat=True)[:WORKER_ROWS_READ]:
        values.update(v for v in (listed or ()) if isinstance(v, str))
    return values


def _in_progress(column: str, using: str) -> set[str]:
    items = WorkItem.objects.using(using).in_progress().order_by()
    return set(items.values_list(column, flat=True).distinct())


def known_work_types(*, using: str = "default", limit: int = 100) -> list[str]:
    """Types with a handler, announced by workers, or in progress."""
    types = set(registry.work_types()) | _announced("work_types", using)
    return sorted(types | _in_progress("work_type", using))[:limit]


def known_queues(*, using: str = "default", limit: int = 100) -> list[str]:
    """`default`, queues announced by workers, and queues of in-progress items."""
    queues = {"default"} | _announced("queues", using)
    return sorted(queues | _in_progress("queue_name", using))[:limit]
