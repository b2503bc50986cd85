"""SQLite's recovery of a batch of expired leases, inside the sweep's IMMEDIATE transaction.

The transaction holds the database's only write lock, so the candidates read
in step 1 cannot change before step 2 updates them (which re-checks status,
expiry and token all the same); the checkpoints follow, numbered per task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...sql.runner import dump_json, run, to_datetime
from ...sql.snapshots import error_boundary
from ...states import WorkItemStatus
from ..base import Pick, Recovered
from . import statements as sql

if TYPE_CHECKING:
    from . import SQLiteStorage


def recover(
    d: SQLiteStorage,
    batch_size: int,
    fail_types: list[str],
    *,
    pick: Pick,
    checkpoint_ids: Callable[[int], list[str]] | None,
    metadata_json: str,
) -> Recovered:
    """Recover up to `batch_size` expired leases (inside the caller's transaction)."""
    statement = sql.expired_candidates(
        d, fail_types, batch_size, exclude=list(pick.exclude), only=pick.only
    )
    candidates = run(d.using, statement)
    if not candidates:
        return Recovered()
    updated = {
        row["work_item_id"]: row for row in run(d.using, sql.recover_candidates(d, candidates))
    }
    recovered = [
        (c, updated[c["work_item_id"]]) for c in candidates if c["work_item_id"] in updated
    ]
    created = 0
    if recovered and checkpoint_ids is not None:
        recovered.sort(key=lambda pair: (pair[0]["task_id"], pair[0]["work_item_id"]))
        ids = checkpoint_ids(len(recovered))
        rows = [
            (checkpoint_id, c["task_id"], c["work_item_id"], dump_json(_snapshot(c, r)) or "{}")
            for checkpoint_id, (c, r) in zip(ids, recovered, strict=True)
        ]
        created = len(run(d.using, sql.append_error_boundaries(d, rows, metadata_json)))
    return Recovered(
        found=len(candidates),
        requeued=sum(1 for _, r in recovered if r["status"] == WorkItemStatus.PENDING),
        failed=sum(1 for _, r in recovered if r["status"] == WorkItemStatus.FAILED),
        cancelled=sum(1 for _, r in recovered if r["status"] == WorkItemStatus.CANCELLED),
        checkpoints=created,
        # Ended (failed, or cancelled as asked): their dependents follow, as on PostgreSQL.
        failed_with_dependents=tuple(
            r["work_item_id"]
            for _, r in recovered
            if r["has_dependents"] and r["status"] != WorkItemStatus.PENDING
        ),
        items=tuple(
            [c["work_item_id"], c["lease_holder"], c["lease_token"], r["status"], c["timed_out"]]
            for c, r in recovered
        ),
    )


def _iso(value: object) -> str | None:
    dt = to_datetime(value)
    return None if dt is None else dt.isoformat()


def _snapshot(candidate: dict[str, Any], recovered: dict[str, Any]) -> dict[str, Any]:
    """The `error_boundary` snapshot of a recovered item (PostgreSQL builds it in SQL)."""
    will_retry = recovered["status"] == WorkItemStatus.PENDING
    return error_boundary(
        error=recovered["error_message"],
        reason=(
            "cancelled"
            if recovered["status"] == WorkItemStatus.CANCELLED
            else "superseded"
            if candidate["will_retry"] and not will_retry
            else "timed_out"
            if candidate["timed_out"]
            else "lease_expired"
        ),
        worker_id=candidate["lease_holder"],
        lease_token=candidate["lease_token"],
        attempt=int(candidate["retry_count"]) + 1,
        retry_count=recovered["retry_count"],
        max_retries=candidate["max_retries"],
        will_retry=will_retry,
        new_status=recovered["status"],
        work_type=candidate["work_type"],
        lease_expires_at=_iso(candidate["lease_expires_at"]),
        heartbeat_at=_iso(candidate["heartbeat_at"]),
        lease_acquired_at=_iso(candidate["lease_acquired_at"]),
    )
