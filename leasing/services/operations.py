"""Operator actions: force-release, force-fail, retry, cancel, delete and run now.

Each action is a fenced compare-and-swap: it applies only if the item is still
in the status (and, for leased items, has the lease token and heartbeat) the
operator saw when they confirmed; otherwise it is skipped and the result says
why. An applied action writes a `state_transition` checkpoint naming the
actor and the reason in the same transaction, so the audit trail cannot
disagree with the row. A worker whose lease was force-released finds its
next renewal, checkpoint or release refused by the fence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction

from .. import signals, validation
from ..exceptions import InvalidInput, WorkItemNotFound
from ..sql import operator as sql
from ..sql import unique
from ..sql.runner import (
    UNIQUE_RACE_ATTEMPTS,
    is_infrastructure_error,
    run,
    run_one,
    to_datetime,
    translate_db_errors,
)
from ..states import CheckpointType, DependencyFailure, WorkItemStatus
from ..storage import storage_for
from .checkpoints import record_checkpoint
from .dependencies import ended_dependencies, failed_with_dependencies, how_it_ended, settle

logger = logging.getLogger("leasing.operations")

# The `new_status` of a deleted item's result (no row is left to have a status).
DELETED = "deleted"


class Action:
    FORCE_RELEASE = sql.FORCE_RELEASE
    FORCE_FAIL = sql.FORCE_FAIL
    RETRY = sql.RETRY
    CANCEL = sql.CANCEL
    DELETE = sql.DELETE
    RUN_NOW = sql.RUN_NOW

    choices = (FORCE_RELEASE, FORCE_FAIL, RETRY, CANCEL, DELETE, RUN_NOW)
    # The statuses each action accepts (its transition's sources; a cancel also
    # asks a running item to stop), and the status it usually leaves (a
    # force-release can end superseded: failed, or cancelled if it was asked to
    # stop; a running item asked to stop stays in progress until its run ends).
    accepts: dict[str, tuple[str, ...]] = {
        **{action: sql.TRANSITION[action].sources for action in choices},
        CANCEL: (WorkItemStatus.PENDING, WorkItemStatus.IN_PROGRESS),
    }
    leaves: dict[str, str] = {
        FORCE_RELEASE: WorkItemStatus.PENDING,
        FORCE_FAIL: WorkItemStatus.FAILED,
        RETRY: WorkItemStatus.PENDING,
        CANCEL: WorkItemStatus.CANCELLED,
        DELETE: DELETED,
        RUN_NOW: WorkItemStatus.PENDING,
    }
    labels: dict[str, str] = {
        FORCE_RELEASE: "Force-released",
        FORCE_FAIL: "Force-failed",
        RETRY: "Retried",
        CANCEL: "Cancelled",
        DELETE: "Deleted",
        RUN_NOW: "Made due now",
    }

    @classmethod
    def offered(cls, status: str, *, deferred: bool = False, stopping: bool = False) -> list[str]:
        """The actions that apply to an item in `status` (the admin offers only these).

        `deferred`: a pending item whose run_after is still ahead (run now applies);
        `stopping`: a running item already asked to stop (cancel does not apply).
        """
        offered = [a for a in cls.choices if status in cls.accepts[a]]
        if not deferred and cls.RUN_NOW in offered:
            offered.remove(cls.RUN_NOW)
        if stopping and cls.CANCEL in offered:
            offered.remove(cls.CANCEL)
        return offered


@dataclass(frozen=True, slots=True)
class OperatorResult:
    """The outcome of one operator action on one item."""

    work_item_id: str
    action: str
    applied: bool
    old_status: str | None
    new_status: str | None
    detail: str
    # Dependents the action failed with the item (a force-fail, a cancel, a superseded
    # or cancelled force-release), and those that had failed with it and stay failed (a retry).
    dependents_failed: int = 0
    dependents_still_failed: int = 0


# `expected_heartbeat_at` default: do not compare the heartbeat.
UNCHECKED: Any = object()


def apply_action(
    action: str,
    work_item_id: str,
    *,
    expected_token: int | None,
    actor: str,
    reason: str,
    expected_heartbeat_at: datetime | None = UNCHECKED,
    expected_status: str | None = None,
    using: str = "default",
) -> OperatorResult:
    """Apply one operator action as a fenced compare-and-swap.

    `action`: `force_release` (in progress; one asked to stop ends cancelled),
    `force_fail` (pending or in progress), `retry` (failed or cancelled),
    `cancel` (pending; a running item is asked to stop), `delete` (pending or finished: the row, its
    checkpoints and edges go, the audit record stays on its task tied to no
    item; skipped while unfinished items depend on it) or `run_now` (a
    pending item whose `run_after` is ahead: made due at the database's now).

    `expected_token` is the `lease_token` the operator saw (None: do not check
    it); a new claim changes it. `expected_heartbeat_at` is the `heartbeat_at`
    they saw: every renewal moves it, so a lease renewed since the page was
    shown is told apart too (the console passes it for the actions that take the
    lease away; a cancel only asks the run to stop). `expected_status` is the status they saw (None:
    any status the action accepts): a failed item retried meanwhile is pending,
    which a delete also accepts, but it is not the item they chose to delete. A
    changed status, token or heartbeat skips the item rather than guessing.
    """
    using = validation.database_alias(using)
    if action not in Action.choices:
        raise InvalidInput(
            f"Unknown action {action!r}; expected one of {', '.join(Action.choices)}."
        )
    work_item_id = validation.non_empty_text("work_item_id", work_item_id)
    actor = validation.non_empty_text("actor", actor, max_length=150)
    reason = validation.non_empty_text("reason", reason, max_length=1000).strip()
    if expected_token is not None:
        expected_token = validation.integer("expected_token", expected_token, minimum=0)
    if expected_status is not None and expected_status not in WorkItemStatus.values:
        raise InvalidInput(
            f"Unknown expected_status {validation._short(expected_status)}; expected one of "
            f"{', '.join(WorkItemStatus.values)}."
        )

    for attempt in range(UNIQUE_RACE_ATTEMPTS):
        try:
            return _apply(
                action,
                work_item_id,
                expected_token=expected_token,
                actor=actor,
                reason=reason,
                expected_heartbeat_at=expected_heartbeat_at,
                expected_status=expected_status,
                using=using,
            )
        except IntegrityError as exc:
            # A concurrent enqueue took the item's unique key after this
            # action looked: run it again, it sees that holder now.
            if not unique.raced(exc) or attempt == UNIQUE_RACE_ATTEMPTS - 1:
                return _unapplied(action, work_item_id, exc)
        except DatabaseError as exc:
            if is_infrastructure_error(exc):
                raise
            return _unapplied(action, work_item_id, exc)
    raise AssertionError("unreachable")  # pragma: no cover


def _unapplied(action: str, work_item_id: str, exc: Exception) -> OperatorResult:
    """The database refused this item's change: it is left as it was, and said so."""
    logger.error("operator action %s on %s failed: %s", action, work_item_id, exc)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return OperatorResult(
        work_item_id, action, False, None, None, f"skipped: the database refused it ({first})"
    )


def _apply(
    action: str,
    work_item_id: str,
    *,
    expected_token: int | None,
    actor: str,
    reason: str,
    expected_heartbeat_at: datetime | None,
    expected_status: str | None,
    using: str,
) -> OperatorResult:
    d = storage_for(using)
    allowed = Action.accepts[action]
    with translate_db_errors(), transaction.atomic(using=using):
        # A retry checks the item's dependencies, locked before the item itself.
        ended_deps = ended_dependencies(using, work_item_id) if action == Action.RETRY else []
        before = run_one(using, sql.lock_item(d, work_item_id, for_delete=action == Action.DELETE))
        if before is None:
            raise WorkItemNotFound(work_item_id)
        skipped = _skip_reason(
            before, allowed, expected_token, expected_heartbeat_at, expected_status
        )
        fails_with_them = before["on_dependency_failure"] == DependencyFailure.FAIL
        if not skipped and ended_deps and fails_with_them:
            dependency, status = ended_deps[0]
            skipped = (
                f"its dependency {dependency} {how_it_ended(status)} and it fails with its "
                "dependencies: retry that one first"
            )
        if not skipped and action == Action.CANCEL and before["cancel_requested_at"]:
            skipped = "it was asked to stop already; its run ends cancelled"
        if not skipped and action == Action.RUN_NOW and not before["deferred"]:
            skipped = "it is due already (no run_after ahead of now)"
        waiting = before["waiting_dependents"]
        if (
            not skipped
            and action == Action.DELETE
            and waiting
            and before["status"] != WorkItemStatus.COMPLETED
        ):
            # A pending item can be cancelled (its dependents then follow their policy); a
            # failed or cancelled one is retried, or what waits for it ended first.
            instead = (
                "cancel it instead"
                if before["status"] == WorkItemStatus.PENDING
                else "retry it, or cancel or force-fail them first"
            )
            skipped = (
                f"{waiting} unfinished item(s) depend on it and would wait for it forever; "
                + instead
            )
        if not skipped and action == Action.RETRY and before["key_holder"]:
            skipped = (
                f"its unique key is held by {before['key_holder']}, which does this work; "
                "retry once that one has finished"
            )
        if skipped:
            return OperatorResult(
                work_item_id,
                action,
                applied=False,
                old_status=before["status"],
                new_status=None,
                detail=f"skipped: {skipped}",
            )
        message = f"{Action.labels[action]} by {actor}: {reason}"
        token = before["lease_token"]
        if action == Action.CANCEL and before["status"] == WorkItemStatus.IN_PROGRESS:
            # Running: asked to stop; its handler sees it within one heartbeat interval.
            message = f"Asked to stop by {actor}: {reason}"
            statement = sql.request_cancel(d, work_item_id, token)
        elif action == Action.RUN_NOW:
            statement = sql.run_now(d, work_item_id, token)
        elif action != Action.DELETE:
            statement = sql.transition(d, action, work_item_id, token, message)
        with transaction.atomic(using=using):  # a savepoint: a unique race is run again
            if action == Action.DELETE:
                *cleanup, remove = sql.delete(d, work_item_id, token)
                for step in cleanup:
                    run(using, step)
                row = run_one(using, remove)
                if row is None:  # pragma: no cover - the row is locked
                    transaction.set_rollback(True, using=using)
                else:
                    row = {**row, "status": DELETED}
            else:
                row = run_one(using, statement)
        if row is None:  # pragma: no cover - the row is locked
            return OperatorResult(
                work_item_id, action, False, before["status"], None, "skipped: changed concurrently"
            )
        dependents_failed: list[str] = []
        ended = (WorkItemStatus.FAILED, WorkItemStatus.CANCELLED)
        if row["has_dependents"] and row["status"] in ended:
            dependents_failed = settle(using, failed=[work_item_id])
        # A retry brings back this item only: dependents that failed with it stay failed
        # until each is retried (then they wait for it again). Said, not left silent.
        still_failed = 0
        if action == Action.RETRY and row["has_dependents"]:
            still_failed = failed_with_dependencies(using, work_item_id)
        record_checkpoint(
            before["task_id"],
            CheckpointType.STATE_TRANSITION,
            {
                "action": action,
                **({"work_item_id": work_item_id} if action == Action.DELETE else {}),
                "actor": actor,
                "reason": reason,
                "old_status": before["status"],
                "new_status": row["status"],
                **(
                    {"cancel_requested": True}
                    if action == Action.CANCEL and row["status"] == WorkItemStatus.IN_PROGRESS
                    else {}
                ),
                "lease_holder": before["lease_holder"],
                "lease_token": before["lease_token"],
                "lease_expires_at": _iso(before["lease_expires_at"]),
                "retry_count": before["retry_count"],
                **({"dependents_failed": len(dependents_failed)} if dependents_failed else {}),
                **({"dependents_still_failed": still_failed} if still_failed else {}),
            },
            # A deleted item's record stays on its task, tied to no item.
            work_item=None if action == Action.DELETE else work_item_id,
            metadata={"source": "operator"},
            using=using,
        )
        if action == Action.FORCE_RELEASE and signals.listened(signals.lease_force_released):
            event = {
                "lease": None,
                "work_item_id": work_item_id,
                "token": before["lease_token"],
                "worker_id": before["lease_holder"],
                "actor": actor,
                "reason": reason,
            }
            signals.send_after_commit(signals.lease_force_released, Action, [event], using=using)
    if row["superseded_by"]:
        message += f" (superseded by {row['superseded_by']}, which holds its unique key)"
    if action == Action.FORCE_RELEASE and row["status"] == WorkItemStatus.CANCELLED:
        message += " (ended cancelled: it was asked to stop)"
    if dependents_failed:
        message += f" ({len(dependents_failed)} dependent item(s) failed with it)"
    if still_failed:
        message += (
            f" ({still_failed} dependent item(s) that failed with their dependencies stay "
            "failed: retry them too, and they wait for it again)"
        )
    return OperatorResult(
        work_item_id,
        action,
        applied=True,
        old_status=before["status"],
        new_status=row["status"],
        detail=message,
        dependents_failed=len(dependents_failed),
        dependents_still_failed=still_failed,
    )


def _skip_reason(
    before: dict[str, Any],
    allowed: tuple[str, ...],
    expected_token: int | None,
    expected_heartbeat_at: datetime | None,
    expected_status: str | None,
) -> str | None:
    """Why the row is no longer the one the operator saw, or None."""
    if before["status"] not in allowed:
        return f"it is {before['status']}, not {' or '.join(allowed)}"
    if expected_status is not None and before["status"] != expected_status:
        return f"it is {before['status']} now, not {expected_status} as when the page was shown"
    if expected_token is not None and before["lease_token"] != expected_token:
        return (
            "its lease changed since the page was shown "
            f"(token {expected_token} -> {before['lease_token']})"
        )
    if expected_heartbeat_at is not UNCHECKED and (
        to_datetime(before["heartbeat_at"]) != expected_heartbeat_at
    ):
        return "its lease was renewed since the page was shown"
    return None


def _iso(value: Any) -> str | None:
    dt = to_datetime(value)
    return None if dt is None else dt.isoformat()


def cancel(work_item_id: str, *, actor: str, reason: str, using: str = "default") -> OperatorResult:
    """Cancel a work item: one not yet running at once, a running one asked to stop.

    A pending item ends `cancelled` now. A running item is asked to stop: its
    handler sees the request within one heartbeat interval (`ctx.cancelled`;
    `checkpoint()` and `run_once()` raise `Cancelled`) and its run ends
    `cancelled`, or its lease runs out and the sweep cancels it; a handler
    that completes anyway completes. Dependents follow their
    `on_dependency_failure`. Audited like every operator action (a
    `state_transition` checkpoint naming `actor` and `reason`). A finished
    item is skipped, and the result says why.
    """
    return apply_action(
        Action.CANCEL, work_item_id, expected_token=None, actor=actor, reason=reason, using=using
    )


__all__ = ["DELETED", "UNCHECKED", "Action", "OperatorResult", "apply_action", "cancel"]
