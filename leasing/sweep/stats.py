"""What a sweep pass found and did."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class RecoveryStats:
    """What one pass of the sweep found and did.

    `expired_found` counts the expired rows this sweep locked (rows another
    sweep had locked are that sweep's); each is either `recovered` (back to
    `pending`), `failed` for good, or `cancelled` (it had been asked to stop,
    `leasing.cancel()`: not retried, and not a failure), so across concurrent
    sweeps the sums add up to the number of items that expired.
    """

    expired_found: int = 0
    recovered: int = 0  # re-queued as pending
    failed: int = 0  # failed for good
    cancelled: int = 0  # ended cancelled, as asked
    checkpoints_created: int = 0
    errors: int = 0
    scan_duration_ms: float = 0.0
    checkpoints_deleted: int = 0
    keys_expired: int = 0
    workers_lost: int = 0
    batches: int = 0
    hours_rolled_up: int = 0  # hours folded into the console's hourly rollup
    scanned_at: datetime | None = None  # the database clock when the pass began
    # Expired leases this pass could not recover (the first few ids): each
    # failed on its own and stays in progress until a later pass recovers it.
    unrecovered: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (for `--json`, django-q2 and the workers table)."""
        data = dataclasses.asdict(self)
        data["scanned_at"] = None if self.scanned_at is None else self.scanned_at.isoformat()
        data["unrecovered"] = list(self.unrecovered)
        return data


# The counts a pass adds up (everything but the duration and the time).
COUNTED = tuple(
    f.name
    for f in dataclasses.fields(RecoveryStats)
    if f.name not in ("scan_duration_ms", "scanned_at", "unrecovered")
)


def describe(stats: RecoveryStats) -> str:
    """One human-readable line for a pass."""
    return (
        f"{stats.expired_found} expired: {stats.recovered} re-queued, {stats.failed} failed, "
        f"{stats.cancelled} cancelled; "
        f"{stats.checkpoints_created} checkpoints written, {stats.checkpoints_deleted} pruned; "
        f"{stats.keys_expired} idempotency keys expired; {stats.workers_lost} workers lost; "
        f"{stats.errors} errors; {stats.scan_duration_ms:.0f} ms"
        + (f"; {stats.hours_rolled_up} hours rolled up" if stats.hours_rolled_up else "")
    )
