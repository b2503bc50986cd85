"""Enqueueing work items: `enqueue()` and `enqueue_many()` (one bulk INSERT).

One bad item in a batch rejects the batch and inserts nothing: input is
validated completely before anything is written, except in a large plain
batch on PostgreSQL, whose COPY takes each item as it is validated, inside
the transaction that a bad item rolls back. A work type needs a registered
handler (`UnknownWorkType` otherwise), unless
`LEASING["ALLOW_UNREGISTERED_TYPES"]` says this process only produces work
for others. On PostgreSQL the insert also sends a NOTIFY in the same
transaction, so idle workers wake as soon as it commits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import signals
from django.db.models.base import ModelState

from .. import tracing, validation
from ..conf import get_settings
from ..exceptions import InvalidInput, UnknownWorkType
from ..handlers import registry as handlers
from ..ids import new_ulids
from ..rates import parse_rate_limit
from ..states import WorkItemStatus

if TYPE_CHECKING:
    from ..models import WorkItem
from ..sql import new_items as sql
from ..sql.new_items import NewItem
from ..sql.runner import translate_db_errors
from ..storage import storage_for
from .enqueue_rules import check_positions, item_rules
from .enqueue_with_rules import insert_with_rules
from .rate_limits import set_key_limits


def _validate(
    work_item_id: str,
    task_id: Any,
    work_type: Any,
    input_data: Any = None,
    priority: Any = 0,
    max_retries: Any = None,
    run_after: Any = None,
    queue_name: Any = "default",
    unique_key: Any = None,
    unique_while: Any = None,
    depends_on: Any = None,
    on_dependency_failure: Any = None,
    rate_key: Any = None,
    fairness_key: Any = None,
    rate_limit: Any = None,
    *,
    retry_defaults: dict[str, int],
) -> NewItem:
    # The common case is checked inline (this runs 100,000 times for a large
    # batch); anything unusual goes through the validators, which raise the
    # specific error.
    if not _plain_text(work_type):
        work_type = validation.non_empty_text("work_type", work_type)
    if work_type not in retry_defaults:
        retry_defaults[work_type] = _default_max_retries(work_type)
    if not _plain_text(task_id):
        task_id = validation.non_empty_text("task_id", task_id)
    if not _plain_text(queue_name):
        queue_name = validation.non_empty_text("queue_name", queue_name)
    if max_retries is None:
        # The handler's default for its type, else LEASING["MAX_RETRIES"].
        max_retries = retry_defaults[work_type]
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
    rules = {}
    if (
        unique_key is not None
        or unique_while is not None
        or depends_on is not None
        or on_dependency_failure is not None
    ):
        rules = item_rules(unique_key, unique_while, depends_on, on_dependency_failure)
    if rate_key is not None or fairness_key is not None or rate_limit is not None:
        rules.update(rate_rules(rate_key, fairness_key, rate_limit))
    return NewItem(
        work_item_id,
        task_id,
        work_type,
        validation.payload("input_data", input_data),
        input_data,
        priority,
        max_retries,
        run_after,
        queue_name,
        **rules,
    )


def rate_rules(rate_key: Any, fairness_key: Any, rate_limit: Any) -> dict[str, Any]:
    """The item's rate key (and the limit it gives the key) and fairness key, validated."""
    rules: dict[str, Any] = {}
    if rate_key is not None:
        rules["rate_key"] = validation.non_empty_text("rate_key", rate_key)
    if fairness_key is not None:
        rules["fairness_key"] = validation.non_empty_text("fairness_key", fairness_key)
    if rate_limit is not None:
        if rate_key is None:
            raise InvalidInput("rate_limit needs a rate_key: the limit is the key's.")
        if not get_settings().rate_limits:
            raise InvalidInput(
                "rate_limit is enforced only while LEASING['RATE_LIMITS'] is set; set it, "
                "e.g. {'key:*': None} for limits given at enqueue only."
            )
        rules["rate_limit"] = parse_rate_limit("rate_limit", rate_limit)
    return rules


def _plain_text(value: Any) -> bool:
    """The common case, checked inline: short ASCII text without NUL or blanks only."""
    return (
        type(value) is str
        and 0 < len(value) <= validation.MAX_KEY_LENGTH
        and value.isascii()
        and not value.isspace()
        and "\x00" not in value
    )


def _default_max_retries(work_type: str) -> int:
    """The type's default retries, once per type and batch; refuses unknown types."""
    conf = get_settings()
    if work_type not in handlers and not conf.allow_unregistered_types:
        raise UnknownWorkType(
            f"No handler is registered for work type {work_type!r}, so nothing would ever "
            "run this item. Register one with @leasing.handler, or set "
            "LEASING['ALLOW_UNREGISTERED_TYPES'] = True in a process that only enqueues."
        )
    per_type = handlers.default_max_retries(work_type)
    return conf.max_retries if per_type is None else per_type


def enqueue(
    task_id: str,
    work_type: str,
    input_data: Any = None,
    priority: int = 0,
    max_retries: int | None = None,
    run_after: datetime | None = None,
    queue_name: str = "default",
    *,
    unique_key: str | None = None,
    unique_while: str | timedelta | None = None,
    depends_on: Iterable[str | WorkItem] | None = None,
    on_dependency_failure: str | None = None,
    rate_key: str | None = None,
    fairness_key: str | None = None,
    rate_limit: str | dict[str, Any] | None = None,
    using: str = "default",
) -> WorkItem:
    """Add one pending work item and return it.

    `max_retries` defaults to `LEASING["MAX_RETRIES"]` (3). `run_after` must be
    timezone-aware; the item is not claimable before it.

    `unique_key`: if an item holds this key already, return that item instead
    of inserting one, with `duplicate = True` (a new item has `duplicate =
    False`). `unique_while` says how long an item holds its key: `"pending"`,
    `"unfinished"` (pending or in progress; the default) or a `timedelta`
    after enqueue. `depends_on`: ids of items (or the items) that must
    complete before this one can be claimed; `on_dependency_failure`:
    `"fail"` (the default) fails it when one of them fails for good,
    `"wait"` leaves it blocked.

    `rate_key`: claims of items with this key are held to its rate limit
    (`LEASING["RATE_LIMITS"]` `"key:<rate_key>"` or `"key:*"`), or to
    `rate_limit` (`"10/s"`, or `{"limit": 10, "per": 1, "burst": 12}`), which
    this enqueue gives the key. `fairness_key`: in a queue of
    `LEASING["FAIR_QUEUES"]`, claims take turns across these keys.
    """
    spec: dict[str, Any] = {
        "task_id": task_id,
        "work_type": work_type,
        "input_data": input_data,
        "priority": priority,
        "max_retries": max_retries,
        "run_after": run_after,
        "queue_name": queue_name,
    }
    if isinstance(depends_on, list | tuple) and any(type(dep) is int for dep in depends_on):
        raise InvalidInput(
            "depends_on: positions in the batch are for enqueue_many(); "
            "enqueue() takes work item ids."
        )
    for name, value in (
        ("unique_key", unique_key),
        ("unique_while", unique_while),
        ("depends_on", depends_on),
        ("on_dependency_failure", on_dependency_failure),
        ("rate_key", rate_key),
        ("fairness_key", fairness_key),
        ("rate_limit", rate_limit),
    ):
        if value is not None:
            spec[name] = value
    items = enqueue_many([spec], using=using)
    return items[0]


_ALLOWED_KEYS = frozenset(
    {
        "task_id",
        "work_type",
        "input_data",
        "priority",
        "max_retries",
        "run_after",
        "queue_name",
        "unique_key",
        "unique_while",
        "depends_on",
        "on_dependency_failure",
        "rate_key",
        "fairness_key",
        "rate_limit",
    }
)


# The keys `_validate` hands to `item_rules`: a large batch in which any item
# sets one is validated in full before it is written, not streamed into a COPY.
_RULE_KEYS = ("unique_key", "unique_while", "depends_on", "on_dependency_failure")
# The keys that keep a large batch out of the COPY when set (not None).
_STREAM_BREAKERS = frozenset((*_RULE_KEYS, "rate_limit"))


def enqueue_many(items: Iterable[Mapping[str, Any]], *, using: str = "default") -> list[WorkItem]:
    """Add many pending work items in one INSERT and return them in order.

    Each item is a mapping with the keyword arguments of `enqueue()`. In a
    batch, `depends_on` may also name another item of the same batch by its
    position (an int). A batch with unique keys or dependencies is inserted
    by `leasing.services.enqueue_with_rules`; each returned item says whether it
    is a `duplicate`.
    """
    using = validation.database_alias(using)
    if isinstance(items, Mapping | str | bytes) or not isinstance(items, Iterable):
        raise InvalidInput("items must be an iterable of mappings of enqueue() arguments.")
    specs = list(items)
    if not specs:
        return []
    if tracing.enabled():
        return tracing.enqueue(using, specs, _enqueue_specs)
    return _enqueue_specs(using, specs)


def _enqueue_specs(using: str, specs: list[Any]) -> list[WorkItem]:
    ids = new_ulids(len(specs))
    if _streamed(using, specs):
        return _copy_while_validating(using, specs, ids)
    new_items = list(_validated(specs, ids))
    limited = {
        i.rate_key: i.rate_limit
        for i in new_items
        if i.rate_limit is not None and i.rate_key is not None
    }
    if limited:
        set_key_limits(using, limited)
    if not all(item.plain for item in new_items):
        check_positions(new_items)
        with translate_db_errors(), transaction.atomic(using=using):
            return insert_with_rules(using, new_items)

    created_at = _insert(using, new_items)
    return _instances(new_items, created_at, using)


def _validated(specs: list[Any], ids: list[str]) -> Iterator[NewItem]:
    """Each spec checked and encoded, in order; the first bad one raises, naming its index."""
    retry_defaults: dict[str, int] = {}
    for index, item in enumerate(specs):
        if not isinstance(item, Mapping):
            raise InvalidInput(f"item {index} must be a mapping of enqueue() arguments.")
        if not _ALLOWED_KEYS.issuperset(item):
            unknown = set(item) - _ALLOWED_KEYS
            raise InvalidInput(
                f"item {index} has unknown keys {sorted(unknown)}; "
                f"allowed: {', '.join(sorted(_ALLOWED_KEYS))}."
            )
        if "task_id" not in item or "work_type" not in item:
            raise InvalidInput(f"item {index} needs task_id and work_type.")
        try:
            yield _validate(ids[index], **item, retry_defaults=retry_defaults)
        except InvalidInput as exc:
            raise type(exc)(f"item {index}: {exc}") from exc


def _streamed(using: str, specs: list[Any]) -> bool:
    """A large plain batch where the storage streams one in: validated while it runs."""
    return (
        len(specs) >= sql.COPY_THRESHOLD
        and storage_for(using).streams_large_batches
        and not any(
            isinstance(spec, Mapping)
            and not _STREAM_BREAKERS.isdisjoint(spec)
            and any(spec.get(key) is not None for key in _STREAM_BREAKERS)
            for spec in specs
        )
    )


def _copy_while_validating(using: str, specs: list[Any], ids: list[str]) -> list[WorkItem]:
    """Validate each item as the storage's stream takes the one before it (a COPY).

    The server inserts (and indexes) rows while this process checks and
    encodes the next ones and builds their `WorkItem`s, instead of one waiting
    for the other; only the shared creation time is set once the COPY is done.
    An item that fails validation aborts the COPY, and the transaction writes
    nothing, as when every item is checked first. Nothing here may touch the
    database while the COPY runs.
    """
    new_items: list[NewItem] = []
    build = _builder(using)
    instances: list[WorkItem] = []

    def stream() -> Iterator[NewItem]:
        for item in _validated(specs, ids):
            new_items.append(item)
            if build is not None:
                instances.append(build(item, None))
            yield item

    storage = storage_for(using)
    with translate_db_errors(), transaction.atomic(using=using):
        created_at = storage.stream(stream())
        storage.notify(i.queue_name for i in new_items)
    if build is None:
        return _instances(new_items, lambda _item: created_at, using)
    for instance in instances:
        values = instance.__dict__
        values["created_at"] = values["updated_at"] = created_at
    return instances


def _instances(
    items: list[NewItem], created_at: Callable[[NewItem], Any], using: str
) -> list[WorkItem]:
    """The inserted rows as `WorkItem`s, without a round trip to read them back."""
    build = _builder(using)
    if build is None:
        # Someone listens to WorkItem's pre_init/post_init: the signals' way.
        from ..models import WorkItem

        fields = [f.attname for f in WorkItem._meta.concrete_fields]
        return [
            WorkItem.from_db(using, fields, [values[f] for f in fields])
            for values in (_values(_row_defaults(), item, created_at(item)) for item in items)
        ]
    return [build(item, created_at(item)) for item in items]


def _row_defaults() -> dict[str, Any]:
    """A new row's values before its item's: the database's defaults, as they read back."""
    from ..models import WorkItem

    values: dict[str, Any] = dict.fromkeys(f.attname for f in WorkItem._meta.concrete_fields)
    values.update(
        status=WorkItemStatus.PENDING,
        lease_token=0,
        retry_count=0,
        interruptions=0,
        dependencies_left=0,
        has_dependents=False,
    )
    return values


def _values(values: dict[str, Any], item: NewItem, stamp: Any) -> dict[str, Any]:
    """`values` (a new row's defaults) with the item's own, by attribute name."""
    values["work_item_id"] = item.work_item_id
    values["task_id"] = item.task_id
    values["work_type"] = item.work_type
    values["priority"] = item.priority
    values["max_retries"] = item.max_retries
    values["run_after"] = item.run_after
    values["queue_name"] = item.queue_name
    values["input_data"] = item.input_data
    values["rate_key"] = item.rate_key
    values["fairness_key"] = item.fairness_key
    values["created_at"] = values["updated_at"] = stamp
    return values


def _builder(using: str) -> Callable[[NewItem, Any], WorkItem] | None:
    """A function that makes a new row's `WorkItem` from a ready `__dict__`, the
    way `Model.from_db` leaves one; None when someone listens to WorkItem's
    pre_init/post_init (Model.__init__ sends both and costs a setattr per field,
    which adds up on large batches)."""
    # Models load only after django.setup(); this module must import before it.
    from ..models import WorkItem

    if signals.pre_init.has_listeners(WorkItem) or signals.post_init.has_listeners(WorkItem):
        return None
    defaults = _row_defaults()

    def build(item: NewItem, stamp: Any) -> WorkItem:
        instance = WorkItem.__new__(WorkItem)
        instance.__dict__.update(_values(defaults.copy(), item, stamp))
        instance._state = ModelState()
        instance._state.adding = False
        instance._state.db = using
        return instance

    return build


def _insert(using: str, items: list[NewItem]) -> Callable[[NewItem], datetime | None]:
    """Insert the rows and wake idle workers; returns each row's creation time (database clock)."""
    return storage_for(using).insert(items)
