"""Enqueueing work items: `enqueue()` and `enqueue_many()` (one bulk INSERT).

Input is validated completely before anything is written (SPEC §14): one bad
item in a batch rejects the batch and inserts nothing. On PostgreSQL the
insert also sends a NOTIFY in the same transaction, so idle workers wake as
soon as it commits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import signals
from django.db.models.base import ModelState

from . import validation
from .conf import get_settings
from .db import Dialect, execute, to_datetime, translate_db_errors
from .exceptions import InvalidInput
from .ids import new_ulids
from .models import WorkItem, WorkItemStatus

NOTIFY_CHANNEL = "leasing_enqueue"
# From this many items on, PostgreSQL loads them with one COPY statement: about
# twice as fast as INSERT ... SELECT unnest() for large batches, slower for a few.
COPY_THRESHOLD = 2000


@dataclass(frozen=True, slots=True)
class _NewItem:
    work_item_id: str
    task_id: str
    work_type: str
    input_json: str | None
    input_data: Any
    priority: int
    max_retries: int
    run_after: datetime | None
    queue_name: str


def _validate(
    work_item_id: str,
    task_id: Any,
    work_type: Any,
    input_data: Any = None,
    priority: Any = 0,
    max_retries: Any = None,
    run_after: Any = None,
    queue_name: Any = "default",
    *,
    retry_defaults: dict[str, int],
) -> _NewItem:
    # The common case is checked inline (this runs 100,000 times for a large
    # batch); anything unusual goes through the validators, which raise the
    # specific error.
    if not _plain_text(work_type):
        work_type = validation.non_empty_text("work_type", work_type)
    if not _plain_text(task_id):
        task_id = validation.non_empty_text("task_id", task_id)
    if not _plain_text(queue_name):
        queue_name = validation.non_empty_text("queue_name", queue_name)
    if max_retries is None:
        # The handler's default for its type, else LEASING["MAX_RETRIES"].
        max_retries = retry_defaults.get(work_type)
        if max_retries is None:
            max_retries = retry_defaults[work_type] = _default_max_retries(work_type)
    elif not (type(max_retries) is int and 0 <= max_retries <= validation.PG_INT_MAX):
        max_retries = validation.integer(
            "max_retries", max_retries, minimum=0, maximum=validation.PG_INT_MAX
        )
    if not (type(priority) is int and validation.PG_INT_MIN <= priority <= validation.PG_INT_MAX):
        priority = validation.integer(
            "priority", priority, minimum=validation.PG_INT_MIN, maximum=validation.PG_INT_MAX
        )
    if run_after is not None:
        run_after = validation.aware_datetime("run_after", run_after)
    return _NewItem(
        work_item_id,
        task_id,
        work_type,
        validation.payload("input_data", input_data),
        input_data,
        priority,
        max_retries,
        run_after,
        queue_name,
    )


def _plain_text(value: Any) -> bool:
    return type(value) is str and value != "" and not value.isspace() and "\x00" not in value


def _default_max_retries(work_type: str) -> int:
    from .handlers import registry

    per_type = registry.default_max_retries(work_type)
    return get_settings().max_retries if per_type is None else per_type


def enqueue(
    task_id: str,
    work_type: str,
    input_data: Any = None,
    priority: int = 0,
    max_retries: int | None = None,
    run_after: datetime | None = None,
    queue_name: str = "default",
    *,
    using: str = "default",
) -> WorkItem:
    """Add one pending work item and return it.

    `max_retries` defaults to `LEASING["MAX_RETRIES"]` (3). `run_after` must be
    timezone-aware; the item is not claimable before it.
    """
    items = enqueue_many(
        [
            {
                "task_id": task_id,
                "work_type": work_type,
                "input_data": input_data,
                "priority": priority,
                "max_retries": max_retries,
                "run_after": run_after,
                "queue_name": queue_name,
            }
        ],
        using=using,
    )
    return items[0]


_ALLOWED_KEYS = frozenset(
    {"task_id", "work_type", "input_data", "priority", "max_retries", "run_after", "queue_name"}
)


def enqueue_many(items: Iterable[Mapping[str, Any]], *, using: str = "default") -> list[WorkItem]:
    """Add many pending work items in one INSERT and return them in order.

    Each item is a mapping with the keyword arguments of `enqueue()`.
    """
    specs = list(items)
    ids = new_ulids(len(specs))
    new_items: list[_NewItem] = []
    retry_defaults: dict[str, int] = {}
    for index, item in enumerate(specs):
        if not isinstance(item, Mapping):
            raise InvalidInput(f"item {index} must be a mapping of enqueue() arguments.")
        unknown = set(item) - _ALLOWED_KEYS
        if unknown:
            raise InvalidInput(
                f"item {index} has unknown keys {sorted(unknown)}; "
                f"allowed: {', '.join(sorted(_ALLOWED_KEYS))}."
            )
        if "task_id" not in item or "work_type" not in item:
            raise InvalidInput(f"item {index} needs task_id and work_type.")
        try:
            new_items.append(_validate(ids[index], **item, retry_defaults=retry_defaults))
        except InvalidInput as exc:
            raise type(exc)(f"item {index}: {exc}") from exc
    if not new_items:
        return []

    dialect = Dialect(using)
    with translate_db_errors(), transaction.atomic(using=using):
        if dialect.is_postgres and len(new_items) >= COPY_THRESHOLD:
            stamps = _copy_postgres(using, new_items)
        elif dialect.is_postgres:
            stamps = _insert_postgres(using, new_items)
        else:
            stamps = _insert_sqlite(using, new_items)
        notify_enqueued(using, {i.queue_name for i in new_items})

    created_at = stamps.get(None)
    return _instances(
        new_items,
        lambda item: stamps.get(item.work_item_id, created_at),
        using,
    )


def _instances(
    items: list[_NewItem], created_at: Callable[[_NewItem], Any], using: str
) -> list[WorkItem]:
    """The inserted rows as `WorkItem`s, without a round trip to read them back.

    Model.__init__ costs about ten microseconds per row (one setattr per
    field, two signals): a second for 100,000 items. Unless someone listens
    to WorkItem's pre_init/post_init, the instances are assembled the way
    `Model.from_db` leaves them, from a ready `__dict__`.
    """
    fields = [f.attname for f in WorkItem._meta.concrete_fields]
    defaults = dict.fromkeys(fields)
    defaults.update(status=WorkItemStatus.PENDING, lease_token=0, retry_count=0)
    listened = signals.pre_init.has_listeners(WorkItem) or signals.post_init.has_listeners(WorkItem)
    result = []
    for item in items:
        stamp = created_at(item)
        values = defaults.copy()
        values["work_item_id"] = item.work_item_id
        values["task_id"] = item.task_id
        values["work_type"] = item.work_type
        values["priority"] = item.priority
        values["max_retries"] = item.max_retries
        values["run_after"] = item.run_after
        values["queue_name"] = item.queue_name
        values["input_data"] = item.input_data
        values["created_at"] = values["updated_at"] = stamp
        if listened:
            result.append(WorkItem.from_db(using, fields, [values[f] for f in fields]))
            continue
        instance = WorkItem.__new__(WorkItem)
        instance.__dict__.update(values)
        instance._state = ModelState()
        instance._state.adding = False
        instance._state.db = using
        result.append(instance)
    return result


_COLUMNS = (
    "work_item_id, task_id, work_type, status, priority, lease_token, retry_count, "
    "max_retries, run_after, queue_name, input_data, created_at, updated_at"
)


def _insert_postgres(using: str, items: list[_NewItem]) -> dict[str | None, datetime | None]:
    # unnest() keeps the statement at eight parameters whatever the batch size,
    # which is much cheaper to bind than one placeholder per value; every row
    # gets the same statement_timestamp(), so one row comes back, not n.
    sql = f"""
        WITH inserted AS (
            INSERT INTO work_items ({_COLUMNS})
            SELECT v.id, v.task_id, v.work_type, 'pending', v.priority, 0, 0,
                   v.max_retries, v.run_after, v.queue_name, v.input::jsonb,
                   statement_timestamp(), statement_timestamp()
            FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::int[],
                        %s::timestamptz[], %s::text[], %s::text[])
                 AS v(id, task_id, work_type, priority, max_retries, run_after, queue_name, input)
            RETURNING 1
        )
        SELECT count(*) AS inserted, statement_timestamp() AS created_at FROM inserted
    """
    params = [
        [i.work_item_id for i in items],
        [i.task_id for i in items],
        [i.work_type for i in items],
        [i.priority for i in items],
        [i.max_retries for i in items],
        [i.run_after for i in items],
        [i.queue_name for i in items],
        [i.input_json for i in items],
    ]
    [row] = execute(using, sql, params)
    if row["inserted"] != len(items):  # pragma: no cover - the INSERT is all or nothing
        raise AssertionError(f"inserted {row['inserted']} of {len(items)} work items")
    return {None: to_datetime(row["created_at"])}


def _copy_postgres(using: str, items: list[_NewItem]) -> dict[str | None, datetime | None]:
    # created_at/updated_at come from the columns' DEFAULT statement_timestamp(),
    # the same for every row of the one COPY statement.
    columns = (
        "work_item_id, task_id, work_type, status, priority, lease_token, retry_count, "
        "max_retries, run_after, queue_name, input_data"
    )
    connection = connections[using]
    connection.ensure_connection()
    # The driver's own cursor (Django's has no COPY); errors still become Django's.
    with connection.wrap_database_errors, connection.connection.cursor() as cursor:
        with cursor.copy(f"COPY work_items ({columns}) FROM STDIN") as copy:
            for i in items:
                copy.write_row(
                    (
                        i.work_item_id,
                        i.task_id,
                        i.work_type,
                        "pending",
                        i.priority,
                        0,
                        0,
                        i.max_retries,
                        i.run_after,
                        i.queue_name,
                        i.input_json,
                    )
                )
        cursor.execute(
            "SELECT created_at FROM work_items WHERE work_item_id = %s", [items[0].work_item_id]
        )
        row = cursor.fetchone()
    return {None: to_datetime(row[0])}


def _insert_sqlite(using: str, items: list[_NewItem]) -> dict[str | None, datetime | None]:
    dialect = Dialect(using)
    per_row = 8
    # Stay under SQLite's bound-variable limit (32766 since 3.32).
    batch = max(1, 32000 // per_row)
    stamps: dict[str | None, datetime | None] = {}
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        values = ", ".join(
            f"(%s, %s, %s, 'pending', %s, 0, 0, %s, %s, %s, %s, {dialect.now}, {dialect.now})"
            for _ in chunk
        )
        params: list[Any] = []
        for i in chunk:
            params += [
                i.work_item_id,
                i.task_id,
                i.work_type,
                i.priority,
                i.max_retries,
                dialect.datetime_param(i.run_after),
                i.queue_name,
                i.input_json,
            ]
        rows = execute(
            using,
            f"INSERT INTO work_items ({_COLUMNS}) VALUES {values} "
            "RETURNING work_item_id, created_at",
            params,
        )
        for r in rows:
            stamps[r["work_item_id"]] = to_datetime(r["created_at"])
    return stamps


def notify_enqueued(using: str, queue_names: Iterable[str]) -> None:
    """Wake idle PostgreSQL workers listening for new items (no-op on SQLite).

    Sent inside the caller's transaction: PostgreSQL delivers it on commit, so
    a woken worker always finds the rows.
    """
    if connections[using].vendor != "postgresql":
        return
    names = sorted(set(queue_names))
    if names:
        execute(
            using,
            "SELECT pg_notify(%s, q) FROM unnest(%s::text[]) AS q",
            [NOTIFY_CHANNEL, names],
        )
