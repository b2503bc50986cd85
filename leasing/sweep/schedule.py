"""Running the sweep from django-q2 (or any scheduler that calls a function).

A site that already runs `qcluster` needs no extra process:
`recoverysweep --schedule` creates or updates one django-q2 `Schedule` that
calls `run_sweep_pass()` every interval. django-q2 is optional
(`django-leasing[schedule]`); nothing here imports it until asked to schedule.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from django.db import transaction

from .. import validation
from ..conf import get_settings
from ..exceptions import InvalidInput
from .sweep import RecoverySweep

# The one row django-q2 scheduled passes share (see run_sweep_pass()).
SCHEDULED_SWEEPER_ID = "sweeper@django-q"
SCHEDULE_NAME = "leasing-recovery-sweep"

_scheduled_sweeps: dict[tuple[Any, ...], RecoverySweep] = {}
_scheduled_lock = threading.Lock()


def run_sweep_pass(
    interval: float | None = None,
    retention: int | None = None,
    create_checkpoints: bool = True,
    cleanup_old_checkpoints: bool = True,
    using: str = "default",
    worker_id: str = SCHEDULED_SWEEPER_ID,
) -> dict[str, Any]:
    """Run one sweep pass and return its stats as a JSON-able dict.

    Meant as a django-q2 scheduled task (see `schedule_sweep()`), or for any
    scheduler that calls a function. `interval` is how often the caller runs
    it: processes not seen for twice that long are marked lost. Passes share
    one `workers` row (`worker_id`), left `stopped` between passes; the sweep
    object is reused within a process so retention stays incremental.
    """
    key = (interval, retention, create_checkpoints, cleanup_old_checkpoints, using, worker_id)
    with _scheduled_lock:
        sweep = _scheduled_sweeps.get(key)
        if sweep is None:
            sweep = _scheduled_sweeps[key] = RecoverySweep(
                scan_interval_seconds=interval,
                create_checkpoints=create_checkpoints,
                cleanup_old_checkpoints=cleanup_old_checkpoints,
                checkpoint_retention_limit=retention,
                using=using,
                worker_id=worker_id,
            )
    stats = sweep.scan_and_recover()
    return {"worker_id": sweep.worker_id, **stats.as_dict()}


# django-q2's `Schedule.minutes` is a PositiveSmallIntegerField: no interval may need more.
MAX_SCHEDULE_MINUTES = 32767


def schedule_minutes(interval_seconds: float) -> int:
    """django-q2 schedules run every whole minute at best: round the interval up."""
    interval_seconds = validation.positive_seconds("interval", interval_seconds)
    minutes = max(1, math.ceil(interval_seconds / 60))
    if minutes > MAX_SCHEDULE_MINUTES:
        # Refused here, in one line, rather than by the Schedule's full_clean() as a traceback.
        raise InvalidInput(
            f"the sweep interval ({interval_seconds:g}s, LEASING['SWEEP_INTERVAL'] unless "
            f"given) is longer than a django-q2 schedule can repeat: at most "
            f"{MAX_SCHEDULE_MINUTES} minutes ({MAX_SCHEDULE_MINUTES * 60}s)."
        )
    return minutes


def schedule_sweep(
    interval_seconds: float | None = None,
    retention: int | None = None,
    create_checkpoints: bool = True,
    cleanup_old_checkpoints: bool = True,
    using: str = "default",
) -> tuple[Any, bool]:
    """Create or update the django-q2 `Schedule` that runs `run_sweep_pass()`.

    Idempotent: the schedule is found by its fixed name (`SCHEDULE_NAME`), so
    running this twice leaves one schedule (duplicates made by hand are
    removed). The interval is rounded up to whole minutes, the finest grain
    of django-q2's MINUTES schedules; the task is told the effective interval
    so "lost" still means two missed passes. Returns `(schedule, created)`.
    """
    from django_q.models import Schedule  # optional dependency, checked by the caller

    conf = get_settings()
    minutes = schedule_minutes(
        conf.sweep_interval if interval_seconds is None else interval_seconds
    )
    retention = validation.integer(
        "retention", conf.checkpoint_retention if retention is None else retention, minimum=1
    )
    for name, flag in (
        ("create_checkpoints", create_checkpoints),
        ("cleanup_old_checkpoints", cleanup_old_checkpoints),
    ):
        if not isinstance(flag, bool):
            raise InvalidInput(f"{name} must be True or False, got {flag!r}.")
    kwargs: dict[str, Any] = {
        "interval": float(minutes * 60),
        "retention": retention,
        "create_checkpoints": create_checkpoints,
        "cleanup_old_checkpoints": cleanup_old_checkpoints,
    }
    if using != "default":
        kwargs["using"] = using
    fields = {
        "func": f"{__name__}.run_sweep_pass",
        "args": None,
        "kwargs": repr(kwargs),
        "schedule_type": Schedule.MINUTES,
        "minutes": minutes,
        "repeats": -1,
    }
    with transaction.atomic(using=using):
        existing = list(
            Schedule.objects.using(using)
            .select_for_update()
            .filter(name=SCHEDULE_NAME)
            .order_by("pk")
        )
        if existing:
            schedule = existing[0]
            for name, value in fields.items():
                setattr(schedule, name, value)
            schedule.full_clean()
            schedule.save(using=using)
            for duplicate in existing[1:]:
                duplicate.delete(using=using)
            return schedule, False
        schedule = Schedule(name=SCHEDULE_NAME, **fields)
        schedule.full_clean()
        schedule.save(using=using)
        return schedule, True


__all__ = [
    "SCHEDULED_SWEEPER_ID",
    "SCHEDULE_NAME",
    "run_sweep_pass",
    "schedule_minutes",
    "schedule_sweep",
]
