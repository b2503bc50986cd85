"""Statements of idempotency keys: claim, read, take over, finish, expire.

A key's claim is its row's `created_at`, compared exactly: a compare-and-swap
token that changes whenever the key is claimed again. A claim made under a
lease carries the lease fence, so a run whose lease moved on cannot start a
side effect, and neither can it record one's outcome.

A claim made under a lease also records the lease's fencing token
(`lease_token`): the pending key's run is that (item, token), alive while the
item is still held under it. Only a key made with `work_item=` but no lease
(or claimed before the column existed) is judged by time: its run is alive
while the item's lease was acquired no later than the key's claim (within the
clock's resolution, a millisecond on SQLite, a claim of the item in the
key's own instant counts as that run).

A key that names a work item that may still run (pending or in progress:
running, or waiting for a retry; failed or cancelled: an operator may retry
it, days later) does not expire: its `expires_at` counts only once the item
has completed (or was purged), so a retry never finds an earlier attempt's key
forgotten and never repeats its effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..states import IdempotencyStatus
from .runner import Statement
from .work_items import CANCELLED, FAILED, IN_PROGRESS, fence
from .work_items import PENDING as ITEM_PENDING

if TYPE_CHECKING:
    from ..storage.base import Storage


PENDING = f"'{IdempotencyStatus.PENDING.value}'"
# The statuses of a work item whose keys are kept past their `expires_at`: it may run
# again (a retry of its own, or an operator's retry of a failed or cancelled item).
MAY_RUN_AGAIN = f"({ITEM_PENDING}, {IN_PROGRESS}, {FAILED}, {CANCELLED})"


def _claim_column(d: Storage, row: str = "") -> str:
    # SQLite stores the time as text and Django would re-format it when read
    # back; the text itself round-trips exactly.
    column = f"{row}.created_at" if row else "created_at"
    return d.as_text(column)


def _token(lease: tuple[str, str, int] | None) -> int | None:
    """The fencing token a claim records (None: not made under a lease)."""
    return None if lease is None else lease[2]


def _fenced(lease: tuple[str, str, int] | None) -> Statement:
    """`AND EXISTS (the lease is held)` for a claim made under a lease."""
    if lease is None:
        return "", []
    item_id, holder, token = lease
    sql = f"AND EXISTS (SELECT 1 FROM work_items WHERE work_item_id = %s AND {fence()})"
    return sql, [item_id, holder, token]


@dataclass(frozen=True, slots=True)
class KeyClaim:
    """What a claim of a key writes: the key, whose it is, the request, how long it lives.

    `lease` is (item id, holder, token) when the claim is made under a lease;
    the key records its token (`lease_token`), which names the key's run.
    """

    key: str
    task_id: str | None
    item_id: str | None
    digest: str
    ttl_seconds: float
    lease: tuple[str, str, int] | None


def insert_claim(d: Storage, claim: KeyClaim) -> Statement:
    """Claim an unused key as `pending`; no row comes back if it exists (or the lease is gone)."""
    fenced, fenced_params = _fenced(claim.lease)
    sql = f"""
        INSERT INTO idempotency_keys (idempotency_key, task_id, work_item_id, request_hash,
                                      response_data, status, created_at, completed_at,
                                      expires_at, lease_token)
        SELECT %s, %s, %s, %s, NULL, {PENDING}, {d.now}, NULL, {d.clock()}, %s
        WHERE 1 = 1 {fenced}
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING {_claim_column(d)} AS claim
    """
    params: list[Any] = [claim.key, claim.task_id, claim.item_id, claim.digest]
    params += [d.offset(claim.ttl_seconds), _token(claim.lease)]
    return sql, [*params, *fenced_params]


def read(d: Storage, key: str, default_owner_seconds: float) -> Statement:
    """The key's state, and whether the run that holds it `pending` is still alive.

    It is expired once its `expires_at` passed, unless its work item may run again.

    The owner is alive when the key names a work item that is still
    `in_progress` under a live lease: the very lease the key was claimed under
    (the same token), or for a key claimed without one, a lease acquired no
    later than the key. A key naming no item: while it is younger than
    `default_owner_seconds`.
    """
    sql = f"""
        SELECT k.status, k.request_hash, k.response_data, {_claim_column(d, "k")} AS claim,
               CASE WHEN k.expires_at IS NOT NULL AND k.expires_at <= {d.now}
                         AND (w.status IS NULL OR w.status NOT IN {MAY_RUN_AGAIN})
                    THEN 1 ELSE 0 END AS expired,
               CASE WHEN k.status <> {PENDING} THEN 0
                    WHEN k.work_item_id IS NULL THEN
                        CASE WHEN k.created_at > {d.clock()} THEN 1 ELSE 0 END
                    WHEN w.status = {IN_PROGRESS} AND w.lease_expires_at > {d.now}
                         AND (w.lease_token = k.lease_token
                              OR (k.lease_token IS NULL
                                  AND (w.lease_acquired_at IS NULL
                                       OR w.lease_acquired_at <= k.created_at)))
                    THEN 1 ELSE 0 END AS owner_alive
        FROM idempotency_keys AS k
        LEFT JOIN work_items AS w ON w.work_item_id = k.work_item_id
        WHERE k.idempotency_key = %s
    """
    return sql, [d.offset(-default_owner_seconds), key]


def take_over(d: Storage, claim: KeyClaim, seen_status: str, seen_claim: Any) -> Statement:
    """Compare-and-swap the row as it was read into a fresh pending claim."""
    fenced, fenced_params = _fenced(claim.lease)
    sql = f"""
        UPDATE idempotency_keys
        SET status = {PENDING}, request_hash = %s, response_data = NULL,
            task_id = %s, work_item_id = %s, created_at = {d.now}, completed_at = NULL,
            expires_at = {d.clock()}, lease_token = %s
        WHERE idempotency_key = %s AND status = %s AND created_at = %s {fenced}
        RETURNING {_claim_column(d)} AS claim
    """
    params: list[Any] = [claim.digest, claim.task_id, claim.item_id, d.offset(claim.ttl_seconds)]
    params.append(_token(claim.lease))
    return sql, [*params, claim.key, seen_status, seen_claim, *fenced_params]


def finish(
    d: Storage,
    key: str,
    claim: Any,
    status: str,
    response_json: str | None,
    lease: tuple[str, str, int] | None = None,
) -> Statement:
    """Store the outcome, if the key is still this claim (and, with `lease`, it is held)."""
    fenced, fenced_params = _fenced(lease)
    sql = f"""
        UPDATE idempotency_keys
        SET status = %s, response_data = {d.json()}, completed_at = {d.now}
        WHERE idempotency_key = %s AND status = {PENDING} AND created_at = %s {fenced}
        RETURNING idempotency_key
    """
    return sql, [status, response_json, key, claim, *fenced_params]


def delete_expired(d: Storage, batch_size: int) -> Statement:
    """Delete up to `batch_size` expired keys (skipping rows another sweep has locked).

    A key whose work item may run again is kept: its retry may still need it.
    """
    sql = f"""
        DELETE FROM idempotency_keys WHERE idempotency_key IN (
            SELECT idempotency_key FROM idempotency_keys AS k
            WHERE expires_at IS NOT NULL AND expires_at <= {d.now}
              AND NOT EXISTS (
                  SELECT 1 FROM work_items AS w
                  WHERE w.work_item_id = k.work_item_id AND w.status IN {MAY_RUN_AGAIN}
              )
            LIMIT %s {d.skip_locked()}
        )
        RETURNING idempotency_key
    """
    return sql, [batch_size]


def item_exists(item_id: str) -> Statement:
    return "SELECT 1 AS found FROM work_items WHERE work_item_id = %s", [item_id]
