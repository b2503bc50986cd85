"""The sweep's statement pieces: how a batch of expired leases is recovered.

For each `in_progress` item whose lease ran out (database clock), in one
conditional UPDATE per batch: `cancelled` if it had been asked to stop
(`leasing.cancel()`; never retried, and counted apart from the failures),
else back to `pending` with `retry_count + 1` while retries remain and the
work type allows a retry after an expired lease, otherwise `failed` for good;
one `error_boundary` checkpoint per item in the same transaction. The UPDATE
re-checks the token (and on SQLite the status and the expiry), so an item its
worker renewed or completed a moment earlier is left alone. A lease that ran
into its deadline (the handler's timeout or `MAX_LEASE_LIFETIME`) is reported
as "Timed out after N s"; "- retry N/M" follows only when the item goes back
to pending (not when it is superseded or cancelled).

Each database runs them its own way (`Storage.recover`): PostgreSQL locks a
batch with SKIP LOCKED and recovers it by row address in one statement with
its checkpoints; SQLite reads and updates inside its one write lock.

Passing through the `expired` status: the CHECK constraint allows it, as the
original schema lists it, but recovery moves an item from `in_progress`
straight to `pending`, `failed` or `cancelled` inside one statement, so no
row ever rests in it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import transitions as T
from .runner import Statement
from .unique import STATUS_SCOPES
from .work_items import IN_PROGRESS, attempt_ended_set

if TYPE_CHECKING:
    from ..storage.base import Storage

MAX_RETRIES_MESSAGE = "Max retries exceeded"
FAIL_POLICY_MESSAGE = "Lease expired - not retried (on_lease_expired=fail)"
# `Timed out after N s` is built in SQL from the row; `- retry N/M` by `recovered_set`.


def error_message(d: Storage, c: str = "c", w: str = "w") -> str:
    """The recovered item's error_message, from the candidate row `c` and the item `w`,
    before `attempt_ended_set` wraps it ("Cancelled as asked; ...", "Superseded by ...")
    or adds the retry note (only to an item that goes back to pending)."""
    return f"""CASE
        WHEN {c}.timed_out = 1 THEN 'Timed out after ' || CAST({c}.cap_seconds AS TEXT) || ' s'
        WHEN {w}.cancel_requested_at IS NOT NULL THEN 'its lease expired'
        WHEN {c}.will_retry = 1 THEN 'Lease expired'
        WHEN {c}.fail_policy = 1 THEN %s
        ELSE %s END"""


def decisions(d: Storage, fail_types_sql: str) -> str:
    """Per candidate: will it be retried, does its type fail on expiry, did it time out."""
    timed_out = "lease_deadline_at IS NOT NULL AND lease_expires_at >= lease_deadline_at"
    return f"""
        CASE WHEN retry_count < max_retries AND NOT ({fail_types_sql})
                  AND cancel_requested_at IS NULL THEN 1 ELSE 0 END AS will_retry,
        CASE WHEN {fail_types_sql} THEN 1 ELSE 0 END AS fail_policy,
        CASE WHEN {timed_out} THEN 1 ELSE 0 END AS timed_out,
        {d.seconds_between("lease_deadline_at", "lease_acquired_at")} AS cap_seconds
    """


def recovered_set(d: Storage) -> Statement:
    sql = attempt_ended_set(
        d,
        T.EXPIRE,
        retrying="c.will_retry = 1",
        run_after="NULL",
        error=error_message(d),
        superseded_by="c.superseded_by",
        row="w",
        note_retry=True,
    )
    # The message three times: in the cancelled, the superseded and the other branch.
    return sql, [FAIL_POLICY_MESSAGE, MAX_RETRIES_MESSAGE] * 3


def superseded(candidates: str) -> str:
    """`candidates` with `superseded_by`: who holds each one's unique key if it returned.

    Another item holding the key now, else the retried candidate of the same
    key with the lowest id (several expired items of one `pending`-scoped key
    cannot all return to pending: the first does, the others are superseded
    by it). One window over the batch, and nothing for a row without a key or
    with a period key, whose holders overlap by design (`unique.other_holder`).
    """
    first = (
        "min(c0.work_item_id) FILTER (WHERE c0.will_retry = 1) "
        "OVER (PARTITION BY c0.unique_key, c0.unique_scope)"
    )
    return f"""
        SELECT c0.*,
               CASE WHEN c0.unique_key IS NOT NULL AND c0.unique_scope IN ({STATUS_SCOPES})
                    THEN COALESCE(c0.holder, NULLIF({first}, c0.work_item_id)) END
                   AS superseded_by
        FROM {candidates} AS c0
    """


def pick_filter(d: Storage, exclude: list[str], only: str | None) -> Statement:
    """The sweep's own filter on expired rows: skip rows that failed alone, or take one."""
    if only is not None:
        return "AND work_item_id = %s", [only]
    if not exclude:
        return "", []
    excluded, params = d.in_list("work_item_id", exclude)
    return f"AND NOT ({excluded})", params


def expired_ids(d: Storage, limit: int, exclude: list[str]) -> Statement:
    """The ids of up to `limit` expired leases in the sweep's order (none locked)."""
    picked, params = pick_filter(d, exclude, None)
    sql = f"""
        SELECT work_item_id FROM work_items
        WHERE status = {IN_PROGRESS} AND lease_expires_at < {d.now} {picked}
        ORDER BY lease_expires_at LIMIT %s
    """
    return sql, [*params, limit]
