"""The hourly rollup of finished items, written by the sweep, read by the console.

Each sweep pass calls `roll_up_finished_hours()`: everything finished up to
the last quarter hour that ended more than `GRACE` ago and not rolled up yet
is folded into `leasing_finished_hours` rows, one per (hour, queue, work
type, status) (at most `MAX_HOURS_PER_PASS` hours a pass, so the first pass
on a large table stays short), and rows older than `KEEP` are pruned. The
mark (`leasing_rollup_marks`) moves a quarter hour at a time: the rows of the
hour it is in hold that hour up to the mark and are written again, whole,
each time it moves, so a reader adds at most a quarter hour (plus `GRACE`) of
items to them, however busy the hour. The mark is locked for the pass, so
two sweeps never roll the same range up twice.

`GRACE` covers the completions whose transaction commits after a quarter
ended: their `completed_at` is the statement's time, a few milliseconds
before the commit. A finished item that shows up later than that is not
counted.

`finished_groups()` reads the items finished in a range from `work_items`
and groups them as the rollup does, per hour or per bucket of a given
length: the console reads its short windows with it, and adds it to the
rolled rows for the hours since the mark.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction

from .. import validation
from ..sql import marks
from ..sql import rollups as sql
from ..sql.runner import (
    database_now,
    dump_json,
    run,
    run_one,
    run_rows,
    to_datetime,
    translate_db_errors,
)
from ..storage import storage_for

ROLLUP = "finished_hours"
GRACE = timedelta(minutes=2)
BACKFILL = timedelta(days=8)  # where the first pass starts: the console's week and a day
KEEP = timedelta(days=35)
MAX_HOURS_PER_PASS = 48
HOUR = timedelta(hours=1)
QUARTER = timedelta(minutes=15)  # how far the mark moves at a time
ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)  # buckets of an hour or less align to it


@dataclass(frozen=True, slots=True)
class FinishedGroup:
    """Items of one (bucket, queue, work type, status) that finished (a rollup row: an hour)."""

    start: datetime  # the bucket's start
    queue_name: str
    work_type: str
    status: str
    items: int
    timed: int  # completed items with a run time
    run_seconds: float  # their run times' sum
    retries: Mapping[int, int]  # retry_count -> items
    run_histogram: Mapping[int, int]  # bucket (leasing.sql.rollups) -> timed items
    quarters: tuple[int, int, int, int]  # items per quarter of the hour


@dataclass(frozen=True, slots=True)
class RollupResult:
    hours: int  # hours (whole or up to the mark) rolled up by this call
    rows: int  # rows written
    through: datetime | None  # everything finished before this is rolled up


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def floor_quarter(moment: datetime) -> datetime:
    hour = floor_hour(moment)
    return hour + (moment - hour) // QUARTER * QUARTER


def ceil_hour(moment: datetime) -> datetime:
    floor = floor_hour(moment)
    return floor if floor == moment else floor + HOUR


def finished_groups(
    start: datetime,
    end: datetime | None = None,
    *,
    step: timedelta = HOUR,
    origin: datetime = ORIGIN,
    using: str = "default",
) -> list[FinishedGroup]:
    """The items finished in [start, end) (no end: up to now), grouped per bucket.

    Buckets are `step` long and aligned to `origin` (by default: hours).
    """
    with translate_db_errors():
        rows = storage_for(using).finished_groups(start, end, step, origin)
    return _fold(rows)


def _fold(rows: Iterable[Mapping[str, Any]]) -> list[FinishedGroup]:
    groups: dict[tuple[datetime, str, str, str], dict[str, Any]] = {}
    for row in rows:
        bucket = to_datetime(row["bucket"])
        assert bucket is not None  # every finished item falls in a bucket
        key = (bucket, row["queue_name"], row["work_type"], row["status"])
        group = groups.get(key)
        if group is None:
            group = groups[key] = {
                "items": 0,
                "timed": 0,
                "run_seconds": 0.0,
                "retries": defaultdict(int),
                "run_histogram": defaultdict(int),
                "quarters": [0, 0, 0, 0],
            }
        n = int(row["n"])
        group["items"] += n
        group["retries"][int(row["retry_count"])] += n
        group["quarters"][int(row["quarter"])] += n
        if row["run_bucket"] is not None:
            group["timed"] += n
            group["run_seconds"] += float(row["run_seconds"])
            group["run_histogram"][int(row["run_bucket"])] += n
    return [
        FinishedGroup(
            start=start,
            queue_name=queue_name,
            work_type=work_type,
            status=status,
            items=g["items"],
            timed=g["timed"],
            run_seconds=g["run_seconds"],
            retries=dict(g["retries"]),
            run_histogram=dict(g["run_histogram"]),
            quarters=tuple(g["quarters"]),
        )
        for (start, queue_name, work_type, status), g in sorted(groups.items())
    ]


def rolled_groups(start: datetime, end: datetime, *, using: str = "default") -> list[FinishedGroup]:
    """The rollup's groups of the hours in [start, end)."""
    d = storage_for(using)
    with translate_db_errors():
        # Tuples, read by position (`sql.rolled_hours`' columns): a week is about 1,500 rows.
        rows = run_rows(using, sql.rolled_hours(d, start, end))
    # The rows' JSON arrays decoded as one document: one decoder call, not one per row.
    extras = json.loads("[" + ",".join(row[7] for row in rows) + "]")
    groups = []
    for row, (retries, histogram, quarters) in zip(rows, extras, strict=True):
        hour_value, queue_name, work_type, status, items, timed, run_seconds, _ = row
        hour = to_datetime(hour_value)
        assert hour is not None  # a NOT NULL column
        groups.append(
            FinishedGroup(
                start=hour,
                queue_name=queue_name,
                work_type=work_type,
                status=status,
                items=items,
                timed=timed,
                run_seconds=run_seconds,
                retries={int(k): v for k, v in retries.items()},
                run_histogram={int(k): v for k, v in histogram.items()},
                quarters=tuple(quarters),
            )
        )
    return groups


def roll_up_finished_hours(
    *, using: str = "default", max_hours: int = MAX_HOURS_PER_PASS
) -> RollupResult:
    """Roll up to the last closed quarter hour (at most `max_hours` hours); prune old rows.

    The hour the mark is in is read again from its start and its rows
    replaced: a row always holds its hour up to the mark.
    """
    max_hours = validation.integer("max_hours", max_hours, minimum=1, maximum=24 * 366)
    d = storage_for(using)
    with translate_db_errors(), transaction.atomic(using=using):
        now = database_now(using)
        run(using, marks.ensure_mark(ROLLUP))
        mark = run_one(using, marks.lock_mark(d, ROLLUP))
        through = to_datetime(mark["through"]) if mark else None
        closed = floor_quarter(now - GRACE)
        start = max(through or floor_hour(now - BACKFILL), floor_hour(now - KEEP))
        if start >= closed:
            return RollupResult(hours=0, rows=0, through=through)
        first_hour = floor_hour(start)
        end = min(closed, first_hour + max_hours * HOUR)
        groups = finished_groups(first_hour, end, using=using)
        # Rows of the hours from `first_hour` to `end`'s (which may end after it).
        run(using, sql.delete_hours(d, first_hour, end))
        for statement in sql.insert_hours(d, [_values(g) for g in groups]):
            run(using, statement)
        run(using, marks.set_mark(d, ROLLUP, end))
        run(using, sql.prune_hours(d, floor_hour(now - KEEP)))
    hours = int((ceil_hour(end) - first_hour) / HOUR)
    return RollupResult(hours=hours, rows=len(groups), through=end)


def _values(group: FinishedGroup) -> tuple[Any, ...]:
    return (
        group.start,
        group.queue_name,
        group.work_type,
        group.status,
        group.items,
        group.timed,
        group.run_seconds,
        dump_json({str(k): v for k, v in group.retries.items()}),
        dump_json({str(k): v for k, v in group.run_histogram.items()}),
        dump_json(list(group.quarters)),
    )


def rollup_mark(*, using: str = "default") -> datetime | None:
    """Everything finished before this is rolled up (None: nothing is)."""
    with translate_db_errors():
        row = run_one(using, marks.read_mark(ROLLUP))
    return to_datetime(row["through"]) if row else None
