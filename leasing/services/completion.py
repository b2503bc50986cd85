"""Completing finished items in batches, without letting one bad row fail the batch.

A busy worker completes what its handlers finished with one fenced statement
per batch (on PostgreSQL together with its next claim). Outputs are validated
before they get here, so a batch statement rarely fails; if one still does for
a reason other than the database itself (say a value the column refuses), the
batch is completed row by row: the good rows commit, and an item whose output
cannot be stored ends as failed with "output not storable: ...".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import DatabaseError

from .. import signals
from ..conf import get_settings
from ..exceptions import DatabaseUnavailable, LeaseConflictError, LeaseExpiredError
from ..sql import work_items as sql
from ..sql.fairness import next_cursors
from ..sql.runner import is_infrastructure_error, run_one
from ..sql.terms import ClaimFilters, LeaseTerms
from ..storage import storage_for
from .dependencies import finish_with_dependents
from .endings import fail_attempt
from .fairness import QUEUE_COLUMN as _QUEUE
from .fairness import TURN_COLUMNS as _KEY
from .fairness import rotation
from .held import Lease
from .leases import LeaseManager
from .terms import claim_limits

Finished = tuple[Lease, str | None]  # a lease and its handler's output, encoded as JSON
_TOKEN = sql.LEASE_COLUMNS.index("lease_token")


@dataclass(frozen=True, slots=True)
class Completion:
    """What became of a batch of finished items."""

    completed: tuple[Lease, ...] = ()
    # The lease moved on before the completion (another run owns the item).
    lost: tuple[Lease, ...] = ()
    # The output could not be stored: the item failed with that reason.
    unstorable: tuple[tuple[Lease, str], ...] = ()
    # Not written because the database went away: try again later.
    unwritten: tuple[Finished, ...] = ()


def _split(
    manager: LeaseManager, done: Sequence[Finished], written: set[tuple[str, int]]
) -> Completion:
    """What a batch statement wrote, plus the rest completed one by one.

    The batch statement leaves alone the leases it lost and the items
    something depends on (their dependents are settled in the same
    transaction, `leasing.services.dependencies`): each of those is tried
    once more on its own.
    """
    keys = [lease.key for lease, _ in done]
    manager.held.discard(key for key in keys if key in written)
    completed = tuple(lease for (lease, _), key in zip(done, keys, strict=True) if key in written)
    _released(manager, completed)
    rest = [entry for entry, key in zip(done, keys, strict=True) if key not in written]
    if not rest:
        return Completion(completed=completed)
    later = complete_one_by_one(manager, rest)
    return Completion(completed + later.completed, later.lost, later.unstorable, later.unwritten)


def _released(manager: LeaseManager, completed: Sequence[Lease]) -> None:
    if completed and signals.listened(signals.lease_released):
        events = [signals.lease_event(lease, status="completed") for lease in completed]
        signals.send_after_commit(signals.lease_released, LeaseManager, events, using=manager.using)


def complete(manager: LeaseManager, done: Sequence[Finished]) -> Completion:
    """Complete held leases with their outputs in one statement (or one transaction)."""
    if not done:
        return Completion()
    try:
        written = _complete_batch(manager, done)
    except DatabaseError as exc:
        if is_infrastructure_error(exc):
            raise
        return complete_one_by_one(manager, done)
    return _split(manager, done, written)


def _complete_batch(manager: LeaseManager, done: Sequence[Finished]) -> set[tuple[str, int]]:
    rows_of = [(lease.work_item_id, lease.token, output) for lease, output in done]
    return storage_for(manager.using).complete(manager.worker_id, rows_of)


def complete_one_by_one(manager: LeaseManager, done: Sequence[Finished]) -> Completion:
    """Complete each lease on its own: one bad row fails only its own item."""
    d = storage_for(manager.using)
    completed: list[Lease] = []
    lost: list[Lease] = []
    unstorable: list[tuple[Lease, str]] = []
    for index, (lease, output) in enumerate(done):
        key = (lease.work_item_id, lease.token)
        try:
            row = run_one(manager.using, sql.complete_one(d, manager.worker_id, *key, output))
            if row is None:  # lost, or something depends on the item
                statement = sql.complete_one(d, manager.worker_id, *key, output, plain=False)
                row = finish_with_dependents(manager.using, statement)
        except DatabaseError as exc:
            if is_infrastructure_error(exc):
                return Completion(
                    tuple(completed), tuple(lost), tuple(unstorable), tuple(done[index:])
                )
            reason = "output not storable: " + (str(exc).strip().splitlines() or ["?"])[0]
            try:
                fail_attempt(manager, lease, reason, retry=False, reason="output_not_storable")
            except (LeaseExpiredError, LeaseConflictError):
                lost.append(lease)  # the item moved on: its new holder decides
                continue
            except (DatabaseUnavailable, DatabaseError) as again:
                if is_infrastructure_error(again):
                    return Completion(
                        tuple(completed), tuple(lost), tuple(unstorable), tuple(done[index:])
                    )
                raise
            unstorable.append((lease, reason))
            continue
        (completed if row is not None else lost).append(lease)
        manager.held.discard([lease.key])
    _released(manager, completed)
    return Completion(tuple(completed), tuple(lost), tuple(unstorable))


def complete_and_claim(
    manager: LeaseManager,
    done: Sequence[Finished],
    n: int,
    terms: LeaseTerms,
    filters: ClaimFilters,
) -> tuple[Completion, list[Lease]]:
    """Complete finished items and claim up to `n` new ones, in one round trip where the
    storage can (`Storage.completes_while_claiming`)."""
    d = storage_for(manager.using)
    fairness = rotation(manager, filters)
    if not done or not d.completes_while_claiming or get_settings().rate_limits:
        completion = complete(manager, done)
        return completion, manager.claim(n, terms, filters)
    rows_of = [(lease.work_item_id, lease.token, output) for lease, output in done]
    limits = claim_limits(filters)
    by_type = manager.shape.by_type(filters)
    statement = d.complete_and_claim(
        manager.worker_id, rows_of, n, terms, filters, limits, by_type=by_type, fairness=fairness
    )
    try:
        rows = d.run_claim(statement, limits)
    except DatabaseError as exc:
        if is_infrastructure_error(exc):
            raise
        completion = complete_one_by_one(manager, done)
        return completion, manager.claim(n, terms, filters)
    # Rows are `sql.LEASE_COLUMNS` and then their kind; a done row has only its key.
    written = {(row[0], row[_TOKEN]) for row in rows if row[-1] == "done"}
    claimed_rows = [row for row in rows if row[-1] == "claimed"]
    if fairness is not None:
        turns = [(row[_QUEUE], row[_KEY], row[_KEY + 1]) for row in claimed_rows]
        manager.fair_cursors.update(next_cursors(fairness, turns))
    claimed = manager.leases_from_rows(claimed_rows)
    manager.shape.claimed(filters, n, len(claimed))
    completion = _split(manager, done, written)
    if len(completion.completed) > len(written) and len(claimed) < n:
        # Items with dependents were completed after the statement's claim:
        # what they released is claimable now.
        claimed += manager.claim(n - len(claimed), terms, filters)
    return completion, claimed
