"""Idempotency keys: run a side effect once per key, even when its item runs twice.

    from leasing import run_once

    receipt = run_once(
        f"charge:{order_id}", {"order": order_id, "amount": 1200},
        lambda: payments.charge(order_id, 1200),
        work_item=lease.work_item_id,
    )

The key's row is claimed first (a `pending` INSERT ... ON CONFLICT DO NOTHING,
so exactly one caller wins), `fn` runs outside any transaction, and its
response is stored with the row `completed`. A second call with the same key
and the same request gets the stored response without running `fn`; with a
different request it gets `IdempotencyConflict`. A `failed` or expired key runs
again. A `pending` key belongs to the run that claimed it: while that run is
alive others get `IdempotencyInProgress` (or wait for it with `wait_seconds`);
once it is gone, the next caller takes the key over with a compare-and-swap.

A key made under a lease is fenced by it from claim to record: a run whose
lease moved on (force-released, recovered by the sweep, claimed again) never
starts `fn`, and if it lost the lease while `fn` ran, its outcome is not
recorded (`LeaseLostError`; with `atomic=True` the effect is rolled back too):
the next attempt takes the key over and runs `fn`, as after a crash.

A key naming a work item does not expire while that item may run again
(pending or in progress, or failed or cancelled, which an operator may retry),
so a retry always finds the keys of earlier attempts.

A pending key's owner is alive when:

- the key was claimed under a lease (`lease=`, or a handler's context): that
  item is still `in_progress` under the same lease, its token unchanged and
  not expired (a retry of the same item after a crash is a new lease, so a
  new owner, however soon it was claimed);
- the key names a work item (`work_item=`) without a lease: that item is
  still `in_progress`, its lease has not expired, and it was not claimed
  again after the key was created (judged by time, to the clock's resolution);
- otherwise: the key is younger than `LEASING["LEASE_DURATION"]`.

Every time comes from the database clock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.transaction import TransactionManagementError

from .. import tracing, validation
from ..conf import get_settings
from ..exceptions import (
    IdempotencyConflict,
    IdempotencyInProgress,
    InvalidDuration,
    InvalidIdempotencyKey,
    InvalidInput,
    LeaseLostError,
    PayloadNotSerializable,
    WorkItemNotFound,
    one_line,
)
from ..sql import idempotency as sql
from ..sql.checkpoints import lease_fence
from ..sql.runner import is_infrastructure_error, load_json, run, run_one
from ..states import IdempotencyStatus
from ..storage import storage_for
from .held import Lease, leased_ids

if TYPE_CHECKING:
    from ..models import WorkItem

logger = logging.getLogger(__name__)

MAX_KEY_LENGTH = validation.MAX_KEY_LENGTH
# How often a waiting caller looks at a pending key again.
POLL_INTERVAL = 0.05
# Claims retried when a concurrent caller changes the row between our reads.
MAX_CLAIM_ATTEMPTS = 10


def request_hash(request: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of `request` (sorted keys, no spaces)."""
    validation.payload("request", request, required=True)  # storable JSON, or a clear error
    try:
        canonical = json.dumps(
            request, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise PayloadNotSerializable(f"request is not JSON-serializable: {exc}") from exc
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def validate_key(key: Any) -> str:
    """A non-empty string of at most 255 characters, else `InvalidIdempotencyKey`."""
    if not isinstance(key, str) or not key.strip():
        raise InvalidIdempotencyKey(
            f"idempotency key must be a non-empty string, got {validation._short(key)}."
        )
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidIdempotencyKey(
            f"idempotency key must be at most {MAX_KEY_LENGTH} characters, got {len(key)}."
        )
    try:
        return validation.storable_text("idempotency key", key)
    except InvalidInput as exc:
        raise InvalidIdempotencyKey(str(exc)) from None


def _ttl_seconds(ttl: timedelta | float | None) -> float:
    if ttl is None:
        return get_settings().idempotency_ttl
    if isinstance(ttl, timedelta):
        ttl = ttl.total_seconds()
    try:
        return validation.positive_seconds("ttl", ttl)
    except InvalidDuration as exc:
        raise InvalidDuration(f"{exc} (a timedelta or a number of seconds)") from None


def _ensure_outside_transaction(using: str) -> None:
    """Refuse to run inside `transaction.atomic()`.

    Inside a transaction the pending row stays invisible to other processes
    until the caller commits, so it could not keep a concurrent caller out,
    and a rollback after `fn` ran would forget that the side effect happened.
    Test cases' own wrapping transaction (pytest-django's `db`) is allowed.
    """
    connection = connections[using]
    if connection.in_atomic_block and not all(
        getattr(block, "_from_testcase", False) for block in connection.atomic_blocks
    ):
        raise TransactionManagementError(
            "run_once() must be called outside transaction.atomic(): its claim has to "
            "commit before fn() runs, and fn()'s effect must not be rolled back with yours."
        )


@tracing.traced_run_once
def run_once(
    key: str,
    request: Any,
    fn: Callable[[], Any],
    task_id: str | None = None,
    work_item: WorkItem | str | None = None,
    ttl: timedelta | float | None = None,
    *,
    wait_seconds: float = 0.0,
    lease: Lease | None = None,
    atomic: bool = False,
    using: str = "default",
) -> Any:
    """Run `fn()` at least once per `key` and never again once its response is recorded:
    an effect that happened just before a crash (or a lost lease) runs again,
    except `fn`'s writes to this database with `atomic=True`, which commit in
    the record's own transaction and so happen at most once (exactly once).

    Returns the response (recorded, or replayed). Two calls at once never
    both run `fn`; a later call with the key gets the recorded response.
    Effects outside the database (an e-mail, an API call) are at least once
    whatever `atomic` says; pass the key to a remote API that takes one to
    close that window. The same in every execution mode of a handler.

    `request` identifies what `fn` does; reusing a key for a different request
    raises `IdempotencyConflict`. The response must be JSON-serializable; the
    value returned is always the JSON round trip of it, the first time as on
    every replay. `ttl` (a timedelta or seconds; default `LEASING
    ["IDEMPOTENCY_TTL"]`, 24 h) is how long the key is remembered. With
    `wait_seconds`, a caller that finds the key pending under a live run waits
    up to that long for it to finish instead of raising `IdempotencyInProgress`.

    If `fn` raises, the key is marked `failed` (so a later call runs it again)
    and the exception propagates. With `lease`, claiming the key is fenced by
    it: a run whose lease moved on gets `LeaseLostError` and `fn` never runs;
    so is recording the outcome: if the lease moved on while `fn` ran, nothing
    is recorded and `LeaseLostError` is raised (the next attempt takes the key
    over and runs `fn` again). With `atomic=True`, `fn` runs inside the
    transaction that records its response, and a lost lease rolls it back too.
    With `lease`, the key names the leased item and its task (`work_item` and
    `task_id` may be omitted; others are refused). A key naming a work item
    does not expire while that item may run again (anything but completed).
    """
    using = validation.database_alias(using)
    key = validate_key(key)
    digest = request_hash(request)
    if not callable(fn):
        raise InvalidInput(f"fn must be callable, got {validation._short(fn)}.")
    if task_id is not None:
        task_id = validation.non_empty_text("task_id", task_id)
    item_id: str | None = None
    if not isinstance(work_item, str | None) and hasattr(work_item, "work_item_id"):  # a WorkItem
        item_id = work_item.work_item_id
        task_id = task_id or work_item.task_id
    elif work_item is not None:
        item_id = validation.non_empty_text("work_item", work_item)
    ttl_seconds = _ttl_seconds(ttl)
    if isinstance(wait_seconds, bool) or not isinstance(wait_seconds, int | float):
        raise InvalidDuration(
            f"wait_seconds must be a number, got {validation._short(wait_seconds)}."
        )
    if wait_seconds != 0:  # 0: do not wait
        try:
            wait_seconds = validation.positive_seconds("wait_seconds", wait_seconds)
        except InvalidDuration as exc:
            raise InvalidDuration(f"{exc} (0: do not wait)") from None
    if not isinstance(atomic, bool):
        raise InvalidInput(f"atomic must be True or False, got {validation._short(atomic)}.")
    if lease is not None:
        # The key is the leased run's: its owner is judged alive by that item's
        # lease (a key naming no item, or another one, could be taken over while
        # this run still ran fn, after LEASE_DURATION or at once).
        item_id, task_id = leased_ids(lease, item_id, task_id)
    _ensure_outside_transaction(using)
    if item_id is not None and not run(using, sql.item_exists(item_id)):
        raise WorkItemNotFound(item_id)

    fence = None if lease is None else (lease.work_item_id, lease.worker_id, lease.token)
    claim = _Claim(sql.KeyClaim(key, task_id, item_id, digest, ttl_seconds, fence), using)
    deadline = time.monotonic() + wait_seconds
    while True:
        outcome = claim.acquire()
        if outcome is not _IN_PROGRESS:
            break
        if time.monotonic() >= deadline:
            raise IdempotencyInProgress(
                f"idempotency key {key!r} is being processed by another live run."
            )
        time.sleep(min(POLL_INTERVAL, max(0.0, deadline - time.monotonic())))
    if isinstance(outcome, _Cached):
        return outcome.response

    ours = outcome  # the claimed row's created_at: our compare-and-swap token
    if atomic:
        return _run_atomically(claim, ours, fn)
    try:
        response = fn()
    except BaseException:
        claim.finish(ours, IdempotencyStatus.FAILED, None)
        raise
    try:
        encoded = validation.payload("response", response)
    except InvalidInput:
        # The effect happened but cannot be stored; failing the key is the
        # honest record (a retry will run it again), and the bug is surfaced.
        claim.finish(ours, IdempotencyStatus.FAILED, None)
        raise
    if not claim.finish(ours, IdempotencyStatus.COMPLETED, encoded):
        # Not recorded: a run whose lease moved on while fn ran is told so (the
        # next attempt takes the key over and runs fn again, as after a crash).
        claim.ensure_lease_held("its response was not recorded")
    return None if encoded is None else json.loads(encoded)


def _run_atomically(claim: _Claim, ours: Any, fn: Callable[[], Any]) -> Any:
    """Run `fn` and record its response in one transaction: both commit, or neither.

    For effects written to the same database: if the database (or the
    process) dies before the commit, the effect is rolled back with the
    record, and the run that takes the key over runs it for the first time.
    """
    try:
        with transaction.atomic(using=claim.using):
            encoded = validation.payload("response", fn())
            # The effect commits only under the lease it was claimed under: the
            # fence share-locks the item (PostgreSQL) until the commit, so the
            # sweep or an operator cannot take the lease halfway.
            claim.ensure_lease_held("the effect was rolled back")
            if not claim.finish(ours, IdempotencyStatus.COMPLETED, encoded):
                # Taken over while fn ran: its effect must not stand beside the other run's.
                raise IdempotencyInProgress(
                    f"idempotency key {claim.key!r} was taken over while its effect ran; "
                    "the effect was rolled back."
                )
    except BaseException:
        claim.finish(ours, IdempotencyStatus.FAILED, None)
        raise
    return None if encoded is None else json.loads(encoded)


class _Cached:
    __slots__ = ("response",)

    def __init__(self, response: Any) -> None:
        self.response = response


_IN_PROGRESS = object()


class _Claim:
    """The statements of one `run_once()` call against one key."""

    def __init__(self, spec: sql.KeyClaim, using: str) -> None:
        self.spec = spec
        self.key = spec.key
        self.digest = spec.digest
        self.using = using
        self.d = storage_for(using)

    def acquire(self) -> Any:
        """Claim the key: its new claim token (ours), a `_Cached` response, or `_IN_PROGRESS`.

        Raises `IdempotencyConflict` for a live key made for another request,
        `LeaseLostError` when claiming under a lease that moved on.
        """
        for _attempt in range(MAX_CLAIM_ATTEMPTS):
            inserted = run_one(self.using, sql.insert_claim(self.d, self.spec))
            if inserted is not None:
                return inserted["claim"]
            self.ensure_lease_held()
            row = run_one(self.using, sql.read(self.d, self.key, get_settings().lease_duration))
            if row is None:
                continue  # deleted (expired) since our INSERT; try again
            if row["expired"]:
                taken = self._take_over(row)
            elif row["request_hash"] != self.digest:
                raise IdempotencyConflict(
                    f"idempotency key {self.key!r} was used for a different request "
                    f"({row['request_hash']}, not {self.digest})."
                )
            elif row["status"] == IdempotencyStatus.COMPLETED:
                return _Cached(load_json(row["response_data"]))
            elif row["status"] == IdempotencyStatus.FAILED or not row["owner_alive"]:
                if row["status"] == IdempotencyStatus.PENDING:
                    logger.warning(
                        "idempotency key %r: its pending run is gone; taking it over", self.key
                    )
                taken = self._take_over(row)
            else:
                return _IN_PROGRESS
            if taken is not None:
                return taken
            self.ensure_lease_held()
        # Every attempt lost a race to a concurrent caller: someone else is on it.
        return _IN_PROGRESS

    def ensure_lease_held(self, outcome: str = "fn was not run") -> None:
        """Raise `LeaseLostError` if the claim was made under a lease that moved on."""
        fence = self.spec.lease
        if fence is not None and not run(self.using, lease_fence(self.d, *fence)):
            raise LeaseLostError(
                f"run_once refused: worker {fence[1]!r} no longer holds work item "
                f"{fence[0]!r} with token {fence[2]}; {outcome}."
            )

    def _take_over(self, row: dict[str, Any]) -> Any:
        """Compare-and-swap the row we read into a fresh pending claim; None if it changed."""
        taken = run_one(self.using, sql.take_over(self.d, self.spec, row["status"], row["claim"]))
        return None if taken is None else taken["claim"]

    def finish(self, claim: Any, status: str, encoded: str | None) -> bool:
        """Store the outcome, if the key is still our pending claim; True if it was."""
        try:
            rows = run(
                self.using,
                sql.finish(self.d, self.key, claim, status, encoded, self.spec.lease),
            )
        except Exception as exc:
            if status == IdempotencyStatus.FAILED:
                # Do not hide fn()'s own exception behind a bookkeeping error;
                # the pending row is taken over once its owner is gone.
                if is_infrastructure_error(exc):  # an outage: one line, not a traceback
                    logger.warning(
                        "idempotency key %r: could not mark it failed: %s", self.key, one_line(exc)
                    )
                else:
                    logger.exception("idempotency key %r: could not mark it failed", self.key)
                return False
            raise
        if not rows:
            logger.warning(
                "idempotency key %r: the claim was taken over (or expired, or its lease "
                "moved on) while fn() ran; its %s outcome was not stored",
                self.key,
                status,
            )
        return bool(rows)


def delete_expired_keys(*, using: str = "default", batch_size: int = 1000) -> int:
    """Delete keys whose `expires_at` has passed; return how many (the sweep calls this).

    Deletes in batches so one pass never holds many row locks; on PostgreSQL
    concurrent sweeps skip each other's rows instead of waiting.
    """
    batch_size = validation.integer("batch_size", batch_size, minimum=1)
    d = storage_for(using)
    total = 0
    while True:
        rows = run(using, sql.delete_expired(d, batch_size))
        total += len(rows)
        if len(rows) < batch_size:
            return total


__all__ = ["delete_expired_keys", "request_hash", "run_once", "validate_key"]
