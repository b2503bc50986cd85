"""Leases: claiming work items, renewing and releasing them.

Every transition is one conditional statement of `leasing.sql.work_items`. A
claim is a compare-and-swap on `status = 'pending'` (with SKIP LOCKED on
PostgreSQL); renewals and releases carry the lease fence (holder, token,
`in_progress`), so a worker whose lease was recovered and re-claimed (a
zombie, even one in the same process as the new run) changes nothing.

The manager remembers the leases it claimed, so API callers may name an item
without its token (the manager then means its newest lease on it); the
worker runtime always passes the lease itself (`Lease.key`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction

from .. import signals, validation
from ..conf import get_settings
from ..exceptions import InvalidInput, LeaseError, one_line
from ..sql import renewals, unique
from ..sql import work_items as sql
from ..sql.renewals import Renewal
from ..sql.runner import (
    UNIQUE_RACE_ATTEMPTS,
    Statement,
    is_infrastructure_error,
    run,
    run_one,
    to_datetime,
    translate_db_errors,
)
from ..sql.terms import ClaimFilters, LeaseTerms
from ..states import WorkItemStatus
from ..storage import storage_for
from .claim_shape import ClaimShape
from .dependencies import finish_with_dependents, settle
from .fairness import claim_fairly, rotation
from .held import HeldLeases, Lease, LeaseKey, ReleaseOutcome, leases_from_rows, outcome_from_row
from .held import refusal as lease_refusal
from .rate_limits import claim_rate_limited
from .terms import claim_filters, claim_limits, claim_terms, error_text, retry_backoff_seconds

logger = logging.getLogger("leasing.worker")

MAX_BATCH = 1000


def rerun_if_raced(using: str, write: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    """Run `write` (an ending that may put an item back to pending) in a transaction.

    If a concurrent enqueue committed a holder of the item's unique key after
    the statement looked (PostgreSQL), the statement broke the key's index and
    changed nothing: it runs again and then finds the holder (superseded).
    """
    for attempt in range(UNIQUE_RACE_ATTEMPTS):
        try:
            with translate_db_errors(), transaction.atomic(using=using):
                return write()
        except IntegrityError as exc:
            if not unique.raced(exc) or attempt == UNIQUE_RACE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


class LeaseManager:
    """Claims, renews and releases leases for one worker id.

    Thread-safe: one manager serves every thread of a worker process (each
    thread uses its own database connection, as Django gives every thread
    its own).
    """

    def __init__(self, worker_id: str, using: str = "default") -> None:
        self.worker_id = validation.non_empty_text("worker_id", worker_id)
        self.using = validation.database_alias(using)
        self.held = HeldLeases()
        self.shape = ClaimShape()
        # Seconds until a closed rate limit opens, after a claim that came back short
        # under rate limits (None: no limit held anything back).
        self.rate_wait: float | None = None
        # Per fair queue, the fairness key this manager's last claim served last.
        self.fair_cursors: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"<LeaseManager worker_id={self.worker_id!r} held={len(self.held)}>"

    def held_leases(self) -> list[Lease]:
        """The leases this manager claimed and has not released or lost."""
        return self.held.all()

    def lease_for(self, work_item_id: str) -> Lease | None:
        """This manager's newest held lease on the item, if any."""
        return self.held.newest(work_item_id)

    def _key(self, work_item_id: Any, token: int | None) -> LeaseKey:
        """The lease a caller means: its explicit token, else the newest one held."""
        work_item_id = validation.non_empty_text("work_item_id", work_item_id)
        if token is not None:
            return (work_item_id, validation.integer("token", token, minimum=0))
        lease = self.held.newest(work_item_id)
        if lease is None:
            raise self.refusal(work_item_id, None, renewing=False)
        return lease.key

    def refusal(self, work_item_id: str, token: int | None, *, renewing: bool) -> Exception:
        """The specific error for a fenced write that matched no row (and forget that lease)."""
        if token is not None:
            self.held.discard([(work_item_id, token)])
        return lease_refusal(self.using, self.worker_id, work_item_id, token, renewing=renewing)

    # --- claiming ---------------------------------------------------------------------

    def acquire_lease(
        self,
        lease_duration_seconds: float | None = None,
        work_type_filter: str | Sequence[str] | None = None,
        task_id_filter: str | None = None,
        queue_filter: str | Sequence[str] | None = None,
    ) -> Lease | None:
        """Claim the highest-priority, earliest available item, or return None."""
        leases = self.acquire_leases(
            1, lease_duration_seconds, work_type_filter, task_id_filter, queue_filter
        )
        return leases[0] if leases else None

    def acquire_leases(
        self,
        n: int,
        lease_duration_seconds: float | None = None,
        work_type_filter: str | Sequence[str] | None = None,
        task_id_filter: str | None = None,
        queue_filter: str | Sequence[str] | None = None,
    ) -> list[Lease]:
        """Claim up to `n` items in one statement, in claim order."""
        n = validation.integer("n", n, minimum=1, maximum=MAX_BATCH)
        terms = claim_terms(lease_duration_seconds)
        filters = claim_filters(work_type_filter, task_id_filter, queue_filter)
        return self.claim(n, terms, filters)

    def claim(self, n: int, terms: LeaseTerms, filters: ClaimFilters) -> list[Lease]:
        """Claim up to `n` items with terms and filters validated by the caller.

        Paused queues and work types are skipped, and no configured
        concurrency limit is exceeded (`Storage.run_claim`) nor rate limit
        (`leasing.services.rate_limits`).
        """
        d = storage_for(self.using)
        limits = claim_limits(filters)
        fairness = rotation(self, filters)
        if get_settings().rate_limits:
            return claim_rate_limited(self, n, terms, filters, limits, fairness)
        if fairness is not None:
            return claim_fairly(self, n, terms, filters, limits, fairness)
        by_type = self.shape.by_type(filters)
        statement = d.claim(self.worker_id, n, terms, filters, limits, by_type=by_type)
        leases = self.leases_from_rows(d.run_claim(statement, limits))
        self.shape.claimed(filters, n, len(leases))
        return leases

    def leases_from_rows(self, rows: Iterable[Sequence[Any]]) -> list[Lease]:
        """Claimed rows (`sql.LEASE_COLUMNS`) as leases, in claim order, remembered as held."""
        leases = leases_from_rows(list(rows), self.worker_id)
        leases.sort(key=lambda lease: (-lease.priority, lease.created_at, lease.work_item_id))
        self.held.add(leases)
        if leases and signals.listened(signals.lease_acquired):
            events = [signals.lease_event(lease) for lease in leases]
            signals.send_after_commit(
                signals.lease_acquired, LeaseManager, events, using=self.using
            )
        return leases

    # --- renewing ---------------------------------------------------------------------

    def renew_lease(
        self,
        work_item_id: str,
        lease_duration_seconds: float | None = None,
        *,
        token: int | None = None,
        progress_age_seconds: float | None = None,
    ) -> bool:
        """Extend a held lease to now + duration (database clock), never past its deadline.

        `progress_age_seconds` records the handler's last proof of work as
        `progress_at = now - age`. Raises `LeaseExpiredError` if the lease ran
        out (a late renewal never resurrects it) or reached its deadline,
        `LeaseConflictError` if another worker holds the item or its token
        moved on, `WorkItemNotFound` for an unknown id.
        """
        duration = claim_terms(lease_duration_seconds).duration
        if progress_age_seconds is not None and (
            isinstance(progress_age_seconds, bool)
            or not isinstance(progress_age_seconds, int | float)
            or not 0 <= progress_age_seconds <= validation.MAX_SECONDS
        ):
            raise InvalidInput(
                f"progress_age_seconds must be a non-negative number, got {progress_age_seconds!r}."
            )
        item_id, held_token = self._key(work_item_id, token)
        statement = renewals.renew_one(
            storage_for(self.using),
            self.worker_id,
            item_id,
            held_token,
            duration,
            progress_age_seconds,
        )
        row = run_one(self.using, statement)
        if row is None:
            raise self.refusal(item_id, held_token, renewing=True)
        self._renewed({(item_id, held_token): to_datetime(row["lease_expires_at"])})
        return True

    def renew_leases(
        self,
        work_item_ids: Iterable[str] | None = None,
        lease_duration_seconds: float | None = None,
        *,
        progress_ages: dict[str, float] | None = None,
        extend_below: float | None = None,
    ) -> tuple[set[str], set[str]]:
        """Renew held leases (all of them by default) in one statement; `(renewed, lost)` ids.

        With `extend_below`, a lease with more than that many seconds left keeps
        its expiry and only records the heartbeat (a HOT-eligible update). A
        lease whose row another transaction holds locked is in neither set (see
        `renew`).
        """
        duration = claim_terms(lease_duration_seconds).duration
        below = duration if extend_below is None else extend_below
        below = min(validation.positive_seconds("extend_below", below), duration)
        wanted = None if work_item_ids is None else set(work_item_ids)
        ages = progress_ages or {}
        renewed, lost = self.renew(
            [
                Renewal(lease.work_item_id, lease.token, duration, below, ages.get(lease.id))
                for lease in self.held.all()
                if wanted is None or lease.work_item_id in wanted
            ]
        )
        return {key[0] for key in renewed}, {key[0] for key in lost}

    def renew(self, requested: Sequence[Renewal]) -> tuple[set[LeaseKey], set[LeaseKey]]:
        """Renew these leases (validated by the caller); returns `(renewed, lost)` keys.

        Lost leases (expired, past their deadline, or moved on) are forgotten.
        On PostgreSQL a lease whose row another transaction has locked at that
        moment (its completion being written, a checkpoint) is in neither set:
        it is still held, and the next renewal takes it.
        """
        storage = storage_for(self.using)
        renewed: dict[LeaseKey, datetime | None] = {}
        lost: set[LeaseKey] = set()
        for start in range(0, len(requested), MAX_BATCH):
            chunk = requested[start : start + MAX_BATCH]
            expiries, chunk_lost = storage.renew(self.worker_id, chunk)
            renewed.update({key: to_datetime(expiry) for key, expiry in expiries.items()})
            lost |= chunk_lost
        self._renewed(renewed)
        self.held.discard(lost)
        return set(renewed), lost

    def _renewed(self, expiries: dict[LeaseKey, datetime | None]) -> None:
        self.held.set_expiries(expiries)
        if expiries and signals.listened(signals.lease_renewed):
            signals.send_after_commit(
                signals.lease_renewed,
                LeaseManager,
                lambda: [
                    self._event(key, expires_at=expires_at) for key, expires_at in expiries.items()
                ],
                using=self.using,
            )

    def _event(self, key: LeaseKey, **extra: Any) -> dict[str, Any]:
        """A signal's arguments for a lease of this manager (the lease itself if it holds it)."""
        lease = self.held.get(key)
        if lease is not None:
            return signals.lease_event(lease, **extra)
        return {
            "lease": None,
            "work_item_id": key[0],
            "token": key[1],
            "worker_id": self.worker_id,
            **extra,
        }

    # --- releasing --------------------------------------------------------------------

    def release_lease(
        self,
        work_item_id: str,
        success: bool,
        output_data: Any = None,
        error: str | BaseException | None = None,
        retry: bool = False,
        *,
        token: int | None = None,
    ) -> ReleaseOutcome:
        """Finish a held lease and say what became of the item.

        Success: `completed` with the output stored. Failure: `failed`, or with
        `retry=True` and retries left, back to `pending` with `retry_count + 1`
        and `run_after` set by exponential backoff with jitter. A worker that no
        longer holds the lease changes nothing and gets `LeaseLostError`.
        """
        if not isinstance(success, bool):
            raise InvalidInput(f"success must be True or False, got {success!r}.")
        if not isinstance(retry, bool):
            raise InvalidInput(f"retry must be True or False, got {retry!r}.")
        output_json = validation.payload("output_data", output_data)
        message = error_text(error)
        key = self._key(work_item_id, token)
        if success:
            return self.complete_one(key, output_json)
        lease = self.held.get(key)
        return self.end_attempt(
            key, retry=retry, error=message, retry_count=lease and lease.retry_count
        )

    def complete_one(self, key: LeaseKey, output_json: str | None) -> ReleaseOutcome:
        """Complete one held lease with its output (already encoded)."""
        d = storage_for(self.using)
        row = run_one(self.using, sql.complete_one(d, self.worker_id, *key, output_json))
        if row is None:  # lost, or something depends on the item
            statement = sql.complete_one(d, self.worker_id, *key, output_json, plain=False)
            row = finish_with_dependents(self.using, statement)
        return self.outcome(key, row)

    def end_attempt(
        self,
        key: LeaseKey,
        *,
        retry: bool,
        error: str | None,
        retry_count: int | None,
        note_retry: bool = False,
    ) -> ReleaseOutcome:
        """End a failed attempt: retried after a backoff while retries are left, else failed.

        `note_retry`: the stored message says "- retry n/m" if (and only if) the
        item goes back to pending, as the statement decides.
        """
        d = storage_for(self.using)
        backoff = retry_backoff_seconds(retry_count or 0)

        def statement(plain: bool) -> Statement:
            return sql.end_attempt(
                d,
                self.worker_id,
                *key,
                retry=retry,
                backoff_seconds=backoff,
                error=error,
                plain=plain,
                note_retry=note_retry,
            )

        def write() -> dict[str, Any] | None:
            row = run_one(self.using, statement(True))
            if row is None:  # lost, or something depends on the item
                row = finish_with_dependents(self.using, statement(False))
            return row

        return self.outcome(key, rerun_if_raced(self.using, write))

    def requeue_lease(self, work_item_id: str, *, token: int | None = None) -> ReleaseOutcome:
        """Give a held item back to `pending` without counting a retry (a worker stopping)."""
        return self.requeue(self._key(work_item_id, token), interrupted=False)

    def requeue(
        self, key: LeaseKey, *, interrupted: bool, error: str | None = None
    ) -> ReleaseOutcome:
        """Hand a lease back; `interrupted` counts the attempt in `interruptions`."""
        d = storage_for(self.using)
        statement = sql.requeue(
            d, self.worker_id, *key, interrupted=interrupted, error=error_text(error)
        )

        def write() -> dict[str, Any] | None:
            row = run_one(self.using, statement)
            if row is None:
                return None
            if row["status"] != WorkItemStatus.PENDING:  # superseded or cancelled
                if row["has_dependents"]:
                    settle(self.using, failed=[row["work_item_id"]])
            else:
                # Another worker can start it now: do not make it wait for a poll.
                d.notify([row["queue_name"]])
            return row

        return self.outcome(key, rerun_if_raced(self.using, write))

    def expire_earlier_leases(self) -> list[str]:
        """Expire what this worker id's earlier process held (called once it registered);
        returns those items' ids. See `sql.work_items.expire_earlier_leases`."""
        d = storage_for(self.using)
        with translate_db_errors():
            rows = run(self.using, sql.expire_earlier_leases(d, self.worker_id))
        return [row["work_item_id"] for row in rows]

    def start_clock(self, lease: Lease, timeout: float, lifetime_end: datetime) -> Lease | None:
        """A timed run that waited in its worker starts: its timeout counts from now.

        Moves the lease's deadline (fenced by its token, only while it is live)
        to now + `timeout`, never past `lifetime_end`; returns the lease as it now
        is, or None if it is no longer held. See `sql.work_items.start_clock`.
        """
        statement = sql.start_clock(
            storage_for(self.using), self.worker_id, *lease.key, timeout, lifetime_end
        )
        with translate_db_errors():
            row = run_one(self.using, statement)
        if row is None:
            return None
        acquired_at = to_datetime(row["lease_acquired_at"])
        deadline_at = to_datetime(row["lease_deadline_at"])
        assert acquired_at is not None and deadline_at is not None  # set by the update
        return lease._replace(acquired_at=acquired_at, deadline_at=deadline_at)

    def cancel_requests(self) -> set[LeaseKey]:
        """The held leases whose items someone asked to stop (`leasing.cancel()`)."""
        d = storage_for(self.using)
        with translate_db_errors():
            rows = run(self.using, sql.cancel_requests(d, self.worker_id))
        return {(row["work_item_id"], row["lease_token"]) for row in rows}

    def requeue_all(self, keys: Sequence[LeaseKey]) -> int:
        """Hand these held leases back in one statement, counting no attempt (a forced
        stop); returns how many were handed back. See `sql.work_items.requeue_all`."""
        if not keys:
            return 0
        d = storage_for(self.using)
        try:
            with translate_db_errors(), transaction.atomic(using=self.using):
                rows = run(self.using, sql.requeue_all(d, self.worker_id, list(keys)))
                d.notify(r["queue_name"] for r in rows if r["status"] == WorkItemStatus.PENDING)
        except DatabaseError as exc:
            if is_infrastructure_error(exc):
                raise
            # One row broke the statement (two of its items share a key that only
            # one pending item can hold, say): hand each back on its own.
            logger.warning("handing back %d items at once failed (%s); one by one", len(keys),
                           one_line(exc))  # fmt: skip
            return self._requeue_each(keys)
        self.held.discard((r["work_item_id"], r["lease_token"]) for r in rows)
        return len(rows)

    def _requeue_each(self, keys: Sequence[LeaseKey]) -> int:
        """`requeue` for each lease: one that fails is logged and left to the sweep."""
        handed_back = 0
        for key in keys:
            try:
                self.requeue(key, interrupted=False, error="handed back by a forced stop")
            except LeaseError:
                continue  # the lease moved on: nothing of ours to hand back
            except DatabaseError as exc:
                if is_infrastructure_error(exc):
                    raise
                logger.exception("could not hand back %s; the sweep will", key[0])
                continue
            handed_back += 1
        return handed_back

    def outcome(self, key: LeaseKey, row: dict[str, Any] | None) -> ReleaseOutcome:
        """The outcome of a fenced release, or the specific error if it matched no row."""
        if row is None:
            raise self.refusal(*key, renewing=False)
        outcome = outcome_from_row(row)
        if signals.listened(signals.lease_released):
            events = [self._event(key, status=outcome.status)]
            signals.send_after_commit(
                signals.lease_released, LeaseManager, events, using=self.using
            )
        self.held.discard([key])
        return outcome


__all__ = ["Lease", "LeaseKey", "LeaseManager", "ReleaseOutcome"]
