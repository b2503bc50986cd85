"""Statements of periodic work: the `schedules` table.

The one that matters is `advance()`: a compare-and-swap of `next_run_at`.
Every scheduler reads the due rows, works out the tick in Python (cron in a
time zone has no SQL form, see `leasing.ticks`) and then runs

    UPDATE schedules SET next_run_at = <next tick> ...
    WHERE id = ? AND enabled AND next_run_at = <the value it read>

in the transaction that enqueues the tick's item. Two schedulers that read
the same row race on that UPDATE: on PostgreSQL the second one waits for the
first one's row lock, then re-checks its WHERE clause against the committed
row (READ COMMITTED) and matches nothing; on SQLite the IMMEDIATE
transaction serializes them. Only the winner enqueues, and its enqueue also
carries a unique key per schedule and tick (`leasing.services.schedules`),
so even a `next_run_at` moved back (a settings change, an operator) cannot
enqueue a tick twice.

`last_error` says why the scheduler's last try at a tick failed
(`record_failure`); the swap that enqueues a tick clears it, and so do the
writes that give the row a new definition or a new start (the old error may
not apply to it).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..ticks import ScheduleSpec
from .runner import Statement, dump_json

if TYPE_CHECKING:
    from ..storage.base import Storage


# The unique key of a tick's item starts with this (`services.schedules.unique_key`).
TICK_KEY_PREFIX = "schedule:"

# What a new definition or an enqueued tick does to the failure the row records.
_CLEAR_ERROR = "last_error = NULL, last_error_at = NULL"

COLUMNS = (
    "id, name, work_type, cron, every, timezone, payload, queue_name, missed, enabled, "
    "from_settings, next_run_at"
)
_DEFINITION = ("work_type", "cron", "every", "timezone", "payload", "queue_name", "missed")


def _definition(d: Storage, spec: ScheduleSpec) -> list[Any]:
    timing = spec.timing
    return [
        spec.work_type,
        timing.cron or "",
        timing.every,
        timing.timezone,
        dump_json(spec.payload),
        spec.queue,
        spec.missed,
    ]


def _placeholders(d: Storage) -> str:
    # payload is the fifth column of _DEFINITION.
    marks = ["%s"] * len(_DEFINITION)
    marks[4] = d.json()
    return ", ".join(marks)


def upsert_from_settings(d: Storage, spec: ScheduleSpec, next_run_at: datetime) -> Statement:
    """Insert a settings schedule, or rewrite its row if its definition changed.

    An unchanged definition (same fingerprint) leaves the row alone, so a
    scheduler that starts does not move the next tick of one already running;
    `enabled` is never touched (the admin's switch survives restarts). A row
    of the same name made in the admin is taken over by the settings.
    """
    columns = ", ".join(_DEFINITION)
    updates = ", ".join(f"{c} = excluded.{c}" for c in _DEFINITION)
    sql = f"""
        INSERT INTO schedules (name, {columns}, enabled, from_settings, fingerprint,
                               next_run_at, created_at, updated_at)
        VALUES (%s, {_placeholders(d)}, %s, %s, %s, %s, {d.now}, {d.now})
        ON CONFLICT (name) DO UPDATE SET {updates},
            from_settings = excluded.from_settings,
            fingerprint = excluded.fingerprint,
            next_run_at = excluded.next_run_at,
            {_CLEAR_ERROR},
            updated_at = excluded.updated_at
        WHERE schedules.fingerprint <> excluded.fingerprint OR NOT schedules.from_settings
        RETURNING id
    """
    params = [
        spec.name,
        *_definition(d, spec),
        True,
        True,
        spec.fingerprint,
        d.datetime_param(next_run_at),
    ]
    return sql, params


def delete_settings_rows_except(d: Storage, names: list[str]) -> Statement:
    """Delete the settings schedules no longer in the settings."""
    if not names:
        return "DELETE FROM schedules WHERE from_settings RETURNING name", []
    keep, params = d.in_list("name", names)
    return f"DELETE FROM schedules WHERE from_settings AND NOT ({keep}) RETURNING name", params


def insert(d: Storage, spec: ScheduleSpec, enabled: bool, next_run_at: datetime) -> Statement:
    """A schedule made in the admin."""
    sql = f"""
        INSERT INTO schedules (name, {", ".join(_DEFINITION)}, enabled, from_settings,
                               fingerprint, next_run_at, created_at, updated_at)
        VALUES (%s, {_placeholders(d)}, %s, %s, '', %s, {d.now}, {d.now})
        RETURNING id
    """
    return sql, [
        spec.name,
        *_definition(d, spec),
        enabled,
        False,
        d.datetime_param(next_run_at),
    ]


def update(
    d: Storage, pk: int, spec: ScheduleSpec, enabled: bool, next_run_at: datetime | None
) -> Statement:
    """Rewrite an admin schedule (never a settings one); None keeps `next_run_at`."""
    marks = _placeholders(d).split(", ")
    sets = ", ".join(f"{c} = {m}" for c, m in zip(_DEFINITION, marks, strict=True))
    keep = "next_run_at" if next_run_at is None else "%s"
    sql = f"""
        UPDATE schedules SET name = %s, {sets}, enabled = %s, next_run_at = {keep},
            {_CLEAR_ERROR}, updated_at = {d.now}
        WHERE id = %s AND NOT from_settings
        RETURNING id
    """
    params = [spec.name, *_definition(d, spec), enabled]
    if next_run_at is not None:
        params.append(d.datetime_param(next_run_at))
    return sql, [*params, pk]


def for_ids(d: Storage, ids: list[int]) -> Statement:
    where, params = d.in_list("id", ids)
    return f"SELECT {COLUMNS} FROM schedules WHERE {where} ORDER BY id", params


def set_enabled(d: Storage, pk: int, enabled: bool, next_run_at: datetime | None) -> Statement:
    """Switch one schedule on (from its next tick after now) or off; a no-op if it already is.

    Switched on, it starts afresh: the failure it recorded before is forgotten.
    """
    keep = "next_run_at" if next_run_at is None else "%s"
    params: list[Any] = [enabled]
    if next_run_at is not None:
        params.append(d.datetime_param(next_run_at))
    clear = f"{_CLEAR_ERROR}, " if enabled else ""
    sql = f"""
        UPDATE schedules SET enabled = %s, next_run_at = {keep}, {clear}updated_at = {d.now}
        WHERE id = %s AND enabled <> %s
        RETURNING id
    """
    return sql, [*params, pk, enabled]


def delete(d: Storage, ids: list[int]) -> Statement:
    """Delete admin schedules (settings ones stay: the settings define them)."""
    where, params = d.in_list("id", ids)
    return f"DELETE FROM schedules WHERE {where} AND NOT from_settings RETURNING id", params


def due(
    d: Storage, now: datetime, limit: int, after: tuple[datetime, int] | None = None
) -> Statement:
    """Enabled schedules whose next tick is at or before `now`, oldest first.

    `after`: the `(next_run_at, id)` of the last row of the page before, so a
    pass can read on past schedules that are due but cannot fire (they keep
    their `next_run_at`) instead of reading them again.
    """
    params: list[Any] = [d.datetime_param(now)]
    past = ""
    if after is not None:
        past = "AND (next_run_at > %s OR (next_run_at = %s AND id > %s))"
        moment = d.datetime_param(after[0])
        params += [moment, moment, after[1]]
    sql = f"""
        SELECT {COLUMNS} FROM schedules
        WHERE enabled AND next_run_at <= %s {past}
        ORDER BY next_run_at, id
        LIMIT %s
    """
    return sql, [*params, limit]


def advance(
    d: Storage, pk: int, expected: datetime, next_run_at: datetime, tick: datetime
) -> Statement:
    """The compare-and-swap that gives a tick to one scheduler (module docstring).

    Returns the row as it is now, definition included: an edit committed since
    the scheduler read the row (a payload, a name) leaves `next_run_at` as it
    was, so the caller compares what it read with this before it enqueues.
    """
    sql = f"""
        UPDATE schedules
        SET next_run_at = %s, last_tick_at = %s, last_run_at = {d.now}, {_CLEAR_ERROR},
            updated_at = {d.now}
        WHERE id = %s AND enabled AND next_run_at = %s
        RETURNING {COLUMNS}
    """
    return sql, [
        d.datetime_param(next_run_at),
        d.datetime_param(tick),
        pk,
        d.datetime_param(expected),
    ]


def record_failure(d: Storage, pk: int, expected: datetime, error: str) -> Statement:
    """Why the tick owed at `expected` could not be enqueued, and since when.

    Outside the tick's (rolled back) transaction, and only while the row still
    owes that tick: a row since edited with a new start, switched off, or whose
    tick another scheduler enqueued keeps what that write left. The same error
    again writes nothing (each pass retries), so `last_error_at` is when the
    scheduler first hit it. `updated_at` stays: a failure is not an edit.
    """
    sql = f"""
        UPDATE schedules SET last_error = %s, last_error_at = {d.now}
        WHERE id = %s AND enabled AND next_run_at = %s
            AND (last_error IS NULL OR last_error <> %s)
    """
    return sql, [error, pk, d.datetime_param(expected), error]


def record_item(d: Storage, pk: int, work_item_id: str) -> Statement:
    """The item the tick enqueued (in the same transaction as `advance`)."""
    return "UPDATE schedules SET last_work_item_id = %s WHERE id = %s", [work_item_id, pk]
