"""Retention of finished work items (`python manage.py purgeitems`).

`work_items` is the hot table: every claim, renewal and release writes it.
Finished rows left forever make its indexes and vacuum slower, so sites purge
completed and failed items after a while. Their checkpoints go with them;
idempotency keys that pointed at them keep their cached responses and lose
only the link. An item holding its task's resume point (its newest
`iteration_end`) is kept while another item of that task is unfinished
(pending or in progress), which resumes from it; a later purge takes it once
that item has finished or checkpointed past it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction

from .. import validation
from ..exceptions import InvalidInput
from ..sql import retention as sql
from ..sql.runner import run, run_each, run_one, translate_db_errors
from ..states import WorkItemStatus
from ..storage import storage_for

FINISHED = (WorkItemStatus.COMPLETED, WorkItemStatus.FAILED, WorkItemStatus.CANCELLED)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `45s`, `2w` or plain seconds, as a positive timedelta."""
    match = _DURATION.match(text)
    if not match:
        raise InvalidInput(
            f"{text!r} is not an age: use a number with an optional unit s, m, h, d or w "
            "(for example 30d)."
        )
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise InvalidInput(f"the age must be positive, got {text!r}.")
    if seconds > validation.MAX_SECONDS:
        raise InvalidInput(
            f"the age must be at most {validation.MAX_SECONDS // 86400} days, got {text!r}."
        )
    return timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class PurgeStats:
    items_deleted: int
    batches: int
    duration_ms: float
    dry_run: bool


def purge_finished_items(
    older_than: timedelta,
    *,
    statuses: Sequence[str] = FINISHED,
    batch_size: int = 5000,
    dry_run: bool = False,
    using: str = "default",
) -> PurgeStats:
    """Delete finished items whose `completed_at` is older than `older_than`.

    Works in batches of `batch_size` rows, one short transaction each, so a
    purge of millions of rows never holds locks for long. Only terminal
    statuses can be purged: a pending or leased item is never deleted here,
    nor a finished one whose checkpoint an unfinished item of its task would
    resume from (see the module docstring), nor one an unfinished dependent
    still waits for.
    """
    using = validation.database_alias(using)
    if not isinstance(older_than, timedelta) or older_than.total_seconds() <= 0:
        raise InvalidInput(f"older_than must be a positive timedelta, got {older_than!r}.")
    statuses = list(statuses)
    bad = [s for s in statuses if s not in FINISHED]
    if not statuses or bad:
        raise InvalidInput(
            f"only finished statuses ({', '.join(FINISHED)}) can be purged, got {statuses!r}."
        )
    batch_size = validation.integer("batch_size", batch_size, minimum=1, maximum=100_000)
    age = validation.positive_seconds("older_than", older_than.total_seconds())
    d = storage_for(using)
    started = time.monotonic()
    if dry_run:
        row = run_one(using, sql.count_finished(d, statuses, age))
        count = row["n"] if row else 0
        return PurgeStats(count, 0, (time.monotonic() - started) * 1000, True)
    deleted = batches = 0
    while True:
        with translate_db_errors(), transaction.atomic(using=using):
            ids = [
                row["work_item_id"]
                for row in run(using, sql.pick_finished(d, statuses, age, batch_size))
            ]
            rows = [] if not ids else run_each(using, sql.delete_items(d, ids))
        batches += 1
        deleted += len(rows)
        if len(rows) < batch_size:
            break
    return PurgeStats(deleted, batches, (time.monotonic() - started) * 1000, False)
