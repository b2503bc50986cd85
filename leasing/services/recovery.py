"""Recovering one batch of expired leases (the sweep's unit of work).

One transaction per batch: the storage recovers it (`Storage.recover`: on
PostgreSQL two statements, on SQLite a read and an update plus the
checkpoints); an item failed for good (or cancelled: it was asked to stop)
that others depend on fails its dependents (those that chose to) in the same
transaction; the `lease_expired` signal goes out once it commits.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from django.db import transaction

from .. import signals
from ..handlers import registry as handlers
from ..ids import new_ulids
from ..sql import recovery as sql
from ..sql.runner import dump_json, run, translate_db_errors
from ..storage import storage_for
from ..storage.base import Pick
from .dependencies import settle


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    found: int = 0  # expired rows taken
    requeued: int = 0
    failed: int = 0  # failed for good
    cancelled: int = 0  # asked to stop: ended cancelled
    checkpoints: int = 0


def recover_batch(
    using: str,
    batch_size: int,
    *,
    create_checkpoints: bool,
    sweeper_id: str,
    exclude: Collection[str] = (),
    only: str | None = None,
) -> BatchOutcome:
    """Recover up to `batch_size` expired leases in one transaction.

    `exclude`: expired rows to leave alone (they failed on their own this
    pass); `only`: recover this one row, if it is still expired.
    """
    storage = storage_for(using)
    metadata = dump_json({"source": "recovery_sweep", "sweeper": sweeper_id}) or "{}"
    with translate_db_errors(), transaction.atomic(using=using):
        recovered = storage.recover(
            batch_size,
            handlers.fail_on_expiry_types(),
            pick=Pick(tuple(sorted(exclude)), only),
            checkpoint_ids=new_ulids if create_checkpoints else None,
            metadata_json=metadata,
            report_items=signals.listened(signals.lease_expired),
        )
        settle(using, failed=recovered.failed_with_dependents)
        _expired(using, recovered.items)
    return BatchOutcome(
        found=recovered.found,
        requeued=recovered.requeued,
        failed=recovered.failed,
        cancelled=recovered.cancelled,
        checkpoints=recovered.checkpoints,
    )


def expired_ids(using: str, limit: int, exclude: Collection[str] = ()) -> list[str]:
    """The next expired leases the sweep would take, oldest first (to recover one by one)."""
    with translate_db_errors():
        rows = run(using, sql.expired_ids(storage_for(using), limit, sorted(exclude)))
    return [row["work_item_id"] for row in rows]


def _expired(using: str, items: Collection[list[object]]) -> None:
    """The `lease_expired` signal, once per recovered item, after the batch commits."""
    if items and signals.listened(signals.lease_expired):
        events = [
            {
                "lease": None,
                "work_item_id": item_id,
                "token": token,
                "worker_id": holder,
                "status": status,
                "timed_out": bool(timed_out),
            }
            for item_id, holder, token, status, timed_out in items
        ]
        signals.send_after_commit(signals.lease_expired, BatchOutcome, events, using=using)
