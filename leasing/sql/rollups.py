"""Statements of the hourly rollup of finished items (`leasing_finished_hours`).

`Storage.finished_groups` reads the items finished in a time range
(`finished_range`), through `work_items_finished_idx` (index-only: it holds
every column read here), grouped per hour, pair, status, retry count and
run-time bucket. The other statements write the rollup; only that service calls
them (and keeps the rollup's mark through `leasing.sql.marks`).

Run times go into log-scale buckets: bucket 0 holds runs under
`FIRST_EDGE` seconds, bucket i >= 1 those in [FIRST_EDGE * RATIO**(i-1),
FIRST_EDGE * RATIO**i). A bucket's midpoint is within 6% of any run in it,
which bounds the error of a percentile read from the histogram.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..states import WorkItemStatus
from .runner import Statement

if TYPE_CHECKING:
    from ..storage.base import Storage


FIRST_EDGE = 0.001  # seconds
RATIO = 1.12
_LOG_RATIO = math.log(RATIO)

FINISHED = [
    WorkItemStatus.COMPLETED.value,
    WorkItemStatus.FAILED.value,
    WorkItemStatus.CANCELLED.value,
]
HOUR_COLUMNS = (
    "hour",
    "queue_name",
    "work_type",
    "status",
    "items",
    "timed",
    "run_seconds",
    "retries",
    "run_histogram",
    "quarters",
)
# SQLite binds at most 32766 parameters per statement.
INSERT_CHUNK = 1000


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a run time (the Python twin of `BUCKET_SQL`)."""
    if seconds < FIRST_EDGE:
        return 0
    return 1 + math.floor(math.log(seconds / FIRST_EDGE) / _LOG_RATIO)


def bucket_value(bucket: int) -> float:
    """The run time a bucket stands for: its geometric midpoint (half the edge for 0)."""
    if bucket <= 0:
        return FIRST_EDGE / 2
    return FIRST_EDGE * RATIO ** (bucket - 1) * math.sqrt(RATIO)


BUCKET_SQL = (
    f"CASE WHEN run IS NULL THEN NULL WHEN run < {FIRST_EDGE} THEN 0 "
    f"ELSE 1 + floor(ln(run / {FIRST_EDGE}) / ln({RATIO}))::int END"
)


def _range(d: Storage, start: datetime, end: datetime | None) -> Statement:
    status_sql, status_params = d.in_list("status", FINISHED)
    sql = f"completed_at >= %s AND {status_sql}"
    params: list[Any] = [d.datetime_param(start), *status_params]
    if end is not None:
        sql += " AND completed_at < %s"
        params.append(d.datetime_param(end))
    return sql, params


def finished_range(d: Storage, start: datetime, end: datetime | None) -> Statement:
    """The condition: finished in [start, end) (no end: up to now); for
    `Storage.finished_groups`, which groups the items per bucket."""
    return _range(d, start, end)


def rolled_hours(d: Storage, start: datetime, end: datetime) -> Statement:
    """The rollup's rows of [start, end); the three JSON columns as one JSON array text.

    One array per row: the reader decodes one document per row instead of three.
    """
    extras = d.json_array_text("retries", "run_histogram", "quarters")
    sql = f"""
        SELECT hour, queue_name, work_type, status, items, timed, run_seconds,
               {extras} AS extras
        FROM leasing_finished_hours WHERE hour >= %s AND hour < %s
    """
    return sql, [d.datetime_param(start), d.datetime_param(end)]


def delete_hours(d: Storage, start: datetime, end: datetime) -> Statement:
    """The rows of [start, end), before they are written again."""
    return (
        "DELETE FROM leasing_finished_hours WHERE hour >= %s AND hour < %s",
        [d.datetime_param(start), d.datetime_param(end)],
    )


def insert_hours(d: Storage, rows: Sequence[Sequence[Any]]) -> list[Statement]:
    """Insert rows of `HOUR_COLUMNS` values (JSON columns given as text)."""
    one = "(" + ", ".join(["%s"] * 7 + [d.json()] * 3) + ")"
    statements = []
    for first in range(0, len(rows), INSERT_CHUNK):
        chunk = rows[first : first + INSERT_CHUNK]
        params = [d.datetime_param(v) if i == 0 else v for row in chunk for i, v in enumerate(row)]
        sql = (
            f"INSERT INTO leasing_finished_hours ({', '.join(HOUR_COLUMNS)}) "
            f"VALUES {', '.join([one] * len(chunk))}"
        )
        statements.append((sql, params))
    return statements


def prune_hours(d: Storage, before: datetime) -> Statement:
    return (
        "DELETE FROM leasing_finished_hours WHERE hour < %s",
        [d.datetime_param(before)],
    )
