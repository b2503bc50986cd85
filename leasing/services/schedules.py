"""Periodic work: syncing `LEASING["SCHEDULES"]`, firing due ticks, admin changes.

    from leasing.services.schedules import run_due, sync_from_settings
    sync_from_settings()      # once, when a scheduler starts
    fired = run_due()         # every second or so: one item per due tick

`run_due()` reads the database clock once, asks for the enabled schedules
whose `next_run_at` has passed, and for each one, in one transaction:

1. computes the tick it owes (`leasing.ticks`: cron in the schedule's time
   zone, or an interval) and the next one after now;
2. moves `next_run_at` from the value it read to the next tick with a
   compare-and-swap (`sql.schedules.advance`); a scheduler that loses the
   race changes nothing and goes on, and so does one whose row was edited
   since it read it (the swap returns the row: a changed definition rolls
   the swap back, and the next pass enqueues the tick as the row now says);
3. enqueues the tick's item with `unique_key="schedule:<name>:<tick>"` held
   for `UNIQUE_FOR` (a period scope: whatever the item's status), so a tick
   can never run twice, even if `next_run_at` is moved back.

A tick that cannot be enqueued (step 3 refused, or any error of the
schedule's own) changes nothing but the row's `last_error`: its one-line
text and when the scheduler first hit it, for the admin, which cannot read
the scheduler's log. The swap of the next tick that is enqueued clears it.

Missed ticks (no scheduler ran for a while) still give one item: for the
most recent due tick. Its input says what it stands for in `_schedule`:
with `missed="skip"` the older ticks are dropped (`skipped` counts them); with
`missed="catch_up"` the item stands for every tick since the first missed one
(`since`, `ticks`), so its handler can make up for the whole period at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, transaction

from .. import validation
from ..exceptions import InvalidInput, one_line
from ..sql import schedules as sql
from ..sql.runner import (
    database_now,
    is_infrastructure_error,
    is_lock_conflict,
    load_json,
    run,
    run_one,
    to_datetime,
)
from ..sql.snapshots import clean_text
from ..storage import storage_for
from ..ticks import ScheduleSpec, parse_timing, tick_input
from .enqueue import enqueue

if TYPE_CHECKING:
    from ..storage.base import Storage


logger = logging.getLogger("leasing.schedules")

# Seconds between two passes of `runscheduler`: a tick is enqueued at most this late.
PASS_INTERVAL = 1.0

# How long a tick's unique key is held, whatever the item's status: far
# longer than any clock skew or operator correction could move a tick back.
UNIQUE_FOR = timedelta(days=400)
# Due schedules handled per pass (the rest wait for the next pass).
PASS_LIMIT = 500
# The most characters of a failure's text a schedule records (`last_error`): a
# line for the admin's list; the log has the whole message and its traceback.
ERROR_CHARS = 300


@dataclass(frozen=True, slots=True)
class Fired:
    """One tick a pass enqueued."""

    schedule: str
    tick: datetime
    work_item_id: str
    ticks: int  # the ticks the item stands for (1 unless some were missed)
    duplicate: bool  # the tick's item existed already (the unique key held)


@dataclass(frozen=True, slots=True)
class SyncResult:
    written: tuple[str, ...]  # created or changed
    removed: tuple[str, ...]  # settings schedules no longer in the settings


def unique_key(name: str, tick: datetime) -> str:
    return f"{sql.TICK_KEY_PREFIX}{name}:{tick.astimezone(UTC).isoformat()}"


# The item's input: the schedule's payload plus `_schedule` (one function, shared
# with the settings' check of the payload's size).
item_input = tick_input


def sync_from_settings(
    specs: Iterable[ScheduleSpec] | None = None,
    *,
    using: str = "default",
    now: datetime | None = None,
) -> SyncResult:
    """Make the table's settings rows match `LEASING["SCHEDULES"]` (or `specs`).

    A new or changed schedule starts at its first tick after now; an
    unchanged one keeps its `next_run_at` and its `enabled` switch. Safe to
    run from several schedulers at once (one upsert per schedule).
    """
    using = validation.database_alias(using)
    if specs is None:
        from ..conf import get_settings

        specs = get_settings().schedules.values()
    specs = list(specs)
    d = storage_for(using)
    now = now or database_now(using)
    written = []
    with transaction.atomic(using=using):
        for spec in specs:
            statement = sql.upsert_from_settings(d, spec, spec.timing.next_after(now))
            if run(using, statement):
                written.append(spec.name)
        removed = run(using, sql.delete_settings_rows_except(d, [s.name for s in specs]))
    for name in written:
        logger.info("schedule %s synced from the settings", name)
    return SyncResult(tuple(written), tuple(sorted(r["name"] for r in removed)))


def run_due(
    *,
    using: str = "default",
    now: datetime | None = None,
    limit: int = PASS_LIMIT,
    reported: set[tuple[str, str]] | None = None,
    on_fired: Callable[[Fired], None] | None = None,
) -> list[Fired]:
    """Enqueue one item for each due schedule (see the module docstring).

    `now` defaults to the database clock; tests pass a moved clock. A
    schedule that cannot enqueue (its work type lost its handler, its time
    zone vanished, its payload outgrew MAX_PAYLOAD_BYTES, any error of its
    own) is logged and retried next pass; the others go on, and it does not
    count towards `limit` (the most ticks a pass enqueues), so schedules that
    keep failing never hold back the ones due after them. Only an outage
    fails the pass. `reported`: the failures a scheduler's earlier passes
    logged (its loop keeps one set); the same failure again is logged at
    DEBUG, so a schedule that cannot run is one ERROR line, not one a pass
    (once it enqueues again, a new failure is a new ERROR line).
    `on_fired`: called with each tick as soon as its item is enqueued, so a
    caller can report the ticks of a pass that an outage then interrupts.
    """
    using = validation.database_alias(using)
    d = storage_for(using)
    now = now or database_now(using)
    fired: list[Fired] = []
    after: tuple[datetime, int] | None = None
    while len(fired) < limit:
        size = limit - len(fired)
        rows = run(using, sql.due(d, now, size, after))
        for row in rows:
            try:
                result = _fire(d, row, now)
            except Exception as exc:
                if is_lock_conflict(exc):
                    logger.info("schedule %s: lock conflict, left to the next pass", row["name"])
                    continue
                if is_infrastructure_error(exc):
                    raise  # an outage: this tick changed nothing, the next pass retries
                _log_failure(row["name"], exc, reported)
                _record_failure(d, row, exc)
                continue
            if result is None:
                continue
            if reported:  # it enqueues again: a later failure is a new one
                reported.difference_update([r for r in reported if r[0] == result.schedule])
            fired.append(result)
            if on_fired is not None:
                on_fired(result)
        if len(rows) < size:
            break  # no schedule due after these
        last = rows[-1]
        moment = to_datetime(last["next_run_at"])
        assert moment is not None  # due() only returns rows with a next tick
        after = (moment, int(last["id"]))
    return fired


def _log_failure(name: str, exc: Exception, reported: set[tuple[str, str]] | None) -> None:
    """One schedule's tick failed: an ERROR line the first time, DEBUG while it repeats."""
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, InvalidInput) else str(exc)
    if reported is not None and (name, text) in reported:
        logger.debug("schedule %s still cannot enqueue its tick: %s", name, text)
        return
    if reported is not None:
        reported.add((name, text))
    # Our own refusals say all there is; anything else gets its traceback.
    logger.error(
        "schedule %s cannot enqueue its tick (retried each pass; the other schedules go on): %s",
        name,
        text,
        exc_info=not isinstance(exc, InvalidInput | DatabaseError),
    )


def failure_text(exc: BaseException) -> str:
    """A failure as a schedule records it: one line, at most ERROR_CHARS, storable anywhere."""
    text = one_line(exc)
    if isinstance(exc, InvalidInput):  # our own refusals read better without their class
        text = text.removeprefix(f"{type(exc).__name__}: ")
    text = clean_text(text, ERROR_CHARS + 1)
    return text if len(text) <= ERROR_CHARS else f"{text[: ERROR_CHARS - 3]}..."


def _record_failure(d: Storage, row: dict[str, Any], exc: Exception) -> None:
    """Record why the row's tick failed; a failure to record is logged, never raised.

    Its own transaction (a savepoint inside a caller's), after the tick's was
    rolled back: the tick stays owed and the pass goes on to the next schedule.
    """
    expected = to_datetime(row["next_run_at"])
    assert expected is not None  # due() only returns rows with a next tick
    try:
        with transaction.atomic(using=d.using):
            run(d.using, sql.record_failure(d, row["id"], expected, failure_text(exc)))
    except Exception as recording:
        logger.warning(
            "schedule %s: could not record why its tick failed: %s",
            row["name"],
            one_line(recording),
        )


def _fire(d: Storage, row: dict[str, Any], now: datetime) -> Fired | None:
    using = d.using
    timing = parse_timing(row["cron"] or None, row["every"], row["timezone"])
    expected = to_datetime(row["next_run_at"])
    assert expected is not None  # due() only returns rows with a next tick
    due = timing.due(expected, now)
    if due is None:
        return None
    name = row["name"]
    payload = load_json(row["payload"]) or {}
    key = unique_key(name, due.tick)
    with transaction.atomic(using=using):
        current = run_one(using, sql.advance(d, row["id"], expected, due.next_run_at, due.tick))
        if current is None:
            return None  # another scheduler took this tick, or the schedule was switched off
        if _definition(current) != _definition(row):
            # Edited (in the admin) since this pass read it, with its next tick kept:
            # its tick is enqueued by the next pass, as the schedule now says.
            transaction.set_rollback(True, using=using)
            logger.info("schedule %s changed during the pass; its tick is left to the next", name)
            return None
        item = enqueue(
            key,
            row["work_type"],
            item_input(name, payload, row["missed"], due),
            queue_name=row["queue_name"],
            unique_key=key,
            unique_while=UNIQUE_FOR,
            using=using,
        )
        run(using, sql.record_item(d, row["id"], item.work_item_id))
    duplicate = bool(getattr(item, "duplicate", False))
    logger.info(
        "schedule %s: tick %s -> item %s%s",
        name,
        due.tick.isoformat(),
        item.work_item_id,
        " (already enqueued)" if duplicate else "",
    )
    return Fired(name, due.tick, item.work_item_id, due.ticks, duplicate)


def _definition(row: dict[str, Any]) -> tuple[Any, ...]:
    """What a row's tick enqueues: its name and definition."""
    return (
        row["name"],
        row["work_type"],
        row["cron"] or "",
        row["every"],
        row["timezone"],
        load_json(row["payload"]),
        row["queue_name"],
        row["missed"],
    )


def save_schedule(
    spec: ScheduleSpec,
    *,
    enabled: bool = True,
    pk: int | None = None,
    retime: bool = True,
    using: str = "default",
) -> int:
    """Create (pk None) or rewrite an admin schedule; returns its id.

    `retime`: start again from the first tick after now (a new timing);
    otherwise `next_run_at` stays, so editing a payload loses no tick. A
    rewrite forgets the failure the row recorded: it may not apply any more.
    """
    using = validation.database_alias(using)
    d = storage_for(using)
    first_tick = spec.timing.next_after(database_now(using))
    with transaction.atomic(using=using):
        if pk is None:
            row = run_one(using, sql.insert(d, spec, enabled, first_tick))
        else:
            row = run_one(using, sql.update(d, pk, spec, enabled, first_tick if retime else None))
    if row is None:
        raise InvalidInput("this schedule comes from LEASING['SCHEDULES'] or no longer exists.")
    return int(row["id"])


def set_enabled(
    ids: Iterable[int],
    enabled: bool,
    *,
    using: str = "default",
    refused: list[str] | None = None,
) -> int:
    """Switch schedules on or off; returns how many changed.

    Switched on, a schedule starts from its first tick after now: the ticks
    it had while off are not owed, and the failure it recorded is forgotten.
    A schedule whose timing this process cannot read (a cron expression
    without cronsim installed, a time zone its tzdata lacks) has no next tick
    to start from: it stays off, the others are switched on, and why is
    logged and appended to `refused` (for the caller to show), one line each.
    """
    using = validation.database_alias(using)
    d = storage_for(using)
    ids = list(ids)
    if not ids:
        return 0
    now = database_now(using)
    changed = 0
    with transaction.atomic(using=using):
        for row in run(using, sql.for_ids(d, ids)):
            next_run_at = None
            if enabled and not row["enabled"]:
                try:
                    timing = parse_timing(row["cron"] or None, row["every"], row["timezone"])
                except InvalidInput as exc:
                    why = f"schedule {row['name']!r} stays off, its next tick unknown here: {exc}"
                    logger.error("%s", why)
                    if refused is not None:
                        refused.append(why)
                    continue
                next_run_at = timing.next_after(now)
            changed += len(run(using, sql.set_enabled(d, row["id"], enabled, next_run_at)))
    return changed


def delete_schedules(ids: Iterable[int], *, using: str = "default") -> int:
    """Delete admin schedules; settings ones stay. Returns how many went."""
    using = validation.database_alias(using)
    ids = list(ids)
    if not ids:
        return 0
    with transaction.atomic(using=using):
        return len(run(using, sql.delete(storage_for(using), ids)))
