"""Recovering one batch of expired leases (the sweep's unit of work).

One transaction per batch: on PostgreSQL two statements (lock the batch and
its tasks' checkpoint locks; recover, checkpoint and notify), on SQLite a
read and an update inside one IMMEDIATE transaction plus the checkpoints.
An item failed for good that others depend on fails its dependents (those
that chose to) in the same transaction.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from django.db import transaction

from .. import signals
from ..handlers import registry as handlers
from ..ids import new_ulids
from ..sql import checkpoints as checkpoints_sql
from ..sql import recovery as sql
from ..sql.dialect import Dialect
from ..sql.runner import dump_json, load_json, run, run_one, to_datetime, translate_db_errors
from ..sql.snapshots import error_boundary
from ..states import WorkItemStatus
from .checkpoints import lock_task_sequences
from .dependencies import settle


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    found: int = 0  # expired rows locked
    requeued: int = 0
    failed: int = 0
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
    d = Dialect(using)
    fail_types = handlers.fail_on_expiry_types()
    metadata = dump_json({"source": "recovery_sweep", "sweeper": sweeper_id}) or "{}"
    pick = Pick(sorted(exclude), only)
    with translate_db_errors(), transaction.atomic(using=using):
        if d.is_postgres:
            return _recover_postgres(d, batch_size, fail_types, create_checkpoints, metadata, pick)
        return _recover_sqlite(d, batch_size, fail_types, create_checkpoints, metadata, pick)


def expired_ids(using: str, limit: int, exclude: Collection[str] = ()) -> list[str]:
    """The next expired leases the sweep would take, oldest first (to recover one by one)."""
    d = Dialect(using)
    with translate_db_errors():
        rows = run(using, sql.expired_ids(d, limit, sorted(exclude)))
    return [row["work_item_id"] for row in rows]


@dataclass(frozen=True, slots=True)
class Pick:
    exclude: list[str]
    only: str | None


def _recover_postgres(
    d: Dialect,
    batch_size: int,
    fail_types: list[str],
    create_checkpoints: bool,
    metadata: str,
    pick: Pick,
) -> BatchOutcome:
    statement = sql.lock_expired_postgres(
        d, batch_size, lock_tasks=create_checkpoints, exclude=pick.exclude, only=pick.only
    )
    locked = run_one(d.using, statement)
    found = locked["found"] if locked else 0
    if not found:
        return BatchOutcome()
    statement = sql.recover_locked_postgres(
        d,
        locked["tids"],  # type: ignore[index]
        fail_types,
        checkpoint_ids=new_ulids(found) if create_checkpoints else None,
        metadata_json=metadata,
        report_items=signals.listened(signals.lease_expired),
    )
    counts = run_one(d.using, statement) or {}
    _expired(d.using, load_json(counts.get("items")) or [])
    settle(d.using, failed=counts.get("failed_with_dependents") or [])
    return BatchOutcome(
        found=found,
        requeued=counts.get("requeued", 0),
        failed=counts.get("failed", 0),
        checkpoints=counts.get("checkpoints", 0),
    )


def _recover_sqlite(
    d: Dialect,
    batch_size: int,
    fail_types: list[str],
    create_checkpoints: bool,
    metadata: str,
    pick: Pick,
) -> BatchOutcome:
    statement = sql.expired_candidates_sqlite(
        d, fail_types, batch_size, exclude=pick.exclude, only=pick.only
    )
    candidates = run(d.using, statement)
    if not candidates:
        return BatchOutcome()
    updated = {
        row["work_item_id"]: row
        for row in run(d.using, sql.recover_candidates_sqlite(d, candidates))
    }
    recovered = [
        (c, updated[c["work_item_id"]]) for c in candidates if c["work_item_id"] in updated
    ]
    settle(
        d.using,
        failed=[
            r["work_item_id"]
            for _, r in recovered
            if r["has_dependents"] and r["status"] == WorkItemStatus.FAILED
        ],
    )
    created = 0
    if recovered and create_checkpoints:
        recovered.sort(key=lambda pair: (pair[0]["task_id"], pair[0]["work_item_id"]))
        lock_task_sequences(d.using, (c["task_id"] for c, _ in recovered))
        ids = new_ulids(len(recovered))
        rows = [
            (checkpoint_id, c["task_id"], c["work_item_id"], dump_json(_snapshot(c, r)) or "{}")
            for checkpoint_id, (c, r) in zip(ids, recovered, strict=True)
        ]
        created = len(
            run(d.using, checkpoints_sql.append_error_boundaries_sqlite(d, rows, metadata))
        )
    _expired(
        d.using,
        [
            [c["work_item_id"], c["lease_holder"], c["lease_token"], r["status"], c["timed_out"]]
            for c, r in recovered
        ],
    )
    return BatchOutcome(
        found=len(candidates),
        requeued=sum(1 for _, r in recovered if r["status"] == WorkItemStatus.PENDING),
        failed=sum(1 for _, r in recovered if r["status"] != WorkItemStatus.PENDING),
        checkpoints=created,
    )


def _expired(using: str, items: list[list[object]]) -> None:
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


def _iso(value: object) -> str | None:
    dt = to_datetime(value)
    return None if dt is None else dt.isoformat()


def _snapshot(candidate: dict[str, object], recovered: dict[str, object]) -> dict[str, object]:
    """The `error_boundary` snapshot of a recovered item (PostgreSQL builds it in SQL)."""
    will_retry = recovered["status"] == WorkItemStatus.PENDING
    return error_boundary(
        error=recovered["error_message"],
        reason=(
            "superseded"
            if candidate["will_retry"] and not will_retry
            else "timed_out"
            if candidate["timed_out"]
            else "lease_expired"
        ),
        worker_id=candidate["lease_holder"],
        lease_token=candidate["lease_token"],
        attempt=int(candidate["retry_count"]) + 1,  # type: ignore[call-overload]
        retry_count=recovered["retry_count"],
        max_retries=candidate["max_retries"],
        will_retry=will_retry,
        new_status=recovered["status"],
        work_type=candidate["work_type"],
        lease_expires_at=_iso(candidate["lease_expires_at"]),
        heartbeat_at=_iso(candidate["heartbeat_at"]),
    )
