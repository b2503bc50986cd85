"""Statements that change a leased work item: claim, complete, fail/retry, requeue, renew.

Two pieces are written once here and composed into every statement:

* the lease fence, `lease_holder = ? AND lease_token = ? AND status = 'in_progress'`,
  which every write made under a lease carries, so a worker whose lease moved
  on (a zombie) changes nothing;
* the SET lists: a claim, a completion, the end of a failed attempt (retried or
  failed for good, shared with the sweep), a hand-back.

Renewals are in `leasing.sql.renewals`.

Every time is the database clock. A lease has an expiry (renewed by
heartbeats) and a deadline (`lease_deadline_at`, set by the claim: the
handler's timeout or `MAX_LEASE_LIFETIME`; a timed run that waited in its
worker has its timeout counted again from its start, `start_clock`): no
renewal moves the expiry past the deadline, so not even a wedged process can
keep a lease forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import transitions as T
from ..transitions import quoted
from .limits import Limits
from .runner import Statement
from .terms import LeaseTerms
from .unique import other_holder, superseded_message

if TYPE_CHECKING:
    from ..storage.base import Storage

# The statuses as SQL literals, for reads; writes take theirs from `leasing.transitions`.
PENDING = quoted(T.PENDING)
IN_PROGRESS = quoted(T.IN_PROGRESS)
COMPLETED = quoted(T.COMPLETED)
FAILED = quoted(T.FAILED)
CANCELLED = quoted(T.CANCELLED)

# What a claim returns: everything a `Lease` carries, in its field order (the
# holder aside); `held.leases_from_rows` reads them by position.
LEASE_COLUMNS = (
    "work_item_id",
    "task_id",
    "work_type",
    "queue_name",
    "priority",
    "input_data",
    "lease_token",
    "lease_acquired_at",
    "lease_expires_at",
    "lease_deadline_at",
    "retry_count",
    "max_retries",
    "interruptions",
    "created_at",
    "trace_context",
)

NO_LIMITS = Limits()

LEASE_CLEARED = "lease_holder = NULL, lease_expires_at = NULL, lease_deadline_at = NULL"


def fence(row: str = "", token: str = "%s") -> str:
    """The lease fence; parameters: the holder, then the token (unless `token` is a column)."""
    p = f"{row}." if row else ""
    return f"{p}lease_holder = %s AND {p}lease_token = {token} AND {p}status = {IN_PROGRESS}"


def returning(row: str, columns: tuple[str, ...] = LEASE_COLUMNS) -> str:
    return ", ".join(f"{row}.{c}" if row else c for c in columns)


# --- claims ---------------------------------------------------------------------------


def _per_type(d: Storage, default: float, overrides: Mapping[str, float]) -> Statement:
    """The clock plus a per-work-type number of seconds, as one expression."""
    if not overrides:
        return d.clock(), [d.offset(default)]
    whens = " ".join(f"WHEN %s THEN {d.clock()}" for _ in overrides)
    params: list[Any] = [v for t, s in overrides.items() for v in (t, d.offset(s))]
    return f"CASE work_type {whens} ELSE {d.clock()} END", [*params, d.offset(default)]


def claim_set(d: Storage, holder: str, terms: LeaseTerms) -> Statement:
    expiry_by_type = {
        t: min(terms.duration_for(t), terms.cap_for(t)) for t in {*terms.durations, *terms.caps}
    }
    default_expiry = min(terms.duration, terms.cap)
    expiry, expiry_params = _per_type(
        d, default_expiry, {t: s for t, s in expiry_by_type.items() if s != default_expiry}
    )
    deadline, deadline_params = _per_type(d, terms.cap, terms.caps)
    sql = f"""
        {T.CLAIM.sets()}, lease_holder = %s, lease_token = lease_token + 1,
        lease_acquired_at = {d.now}, lease_expires_at = {expiry},
        lease_deadline_at = {deadline}, heartbeat_at = {d.now}, progress_at = NULL,
        cancel_requested_at = NULL,
        started_at = COALESCE(started_at, {d.now}), updated_at = {d.now}
    """
    return sql, [holder, *expiry_params, *deadline_params]


def start_clock(
    d: Storage, holder: str, item_id: str, token: int, timeout: float, lifetime_end: datetime
) -> Statement:
    """Count a live lease's timeout from now (its handler starts after waiting in its worker).

    Its deadline becomes now + `timeout`, never past `lifetime_end` (its claim
    plus its lifetime), and it is acquired now, so a time-out still reads as
    its timeout; fenced, and only while the lease is live.
    """
    sql = f"""
        UPDATE work_items
        SET lease_acquired_at = {d.now}, lease_deadline_at = {d.earliest(d.clock(), "%s")},
            updated_at = {d.now}
        WHERE work_item_id = %s AND {fence()} AND lease_expires_at > {d.now}
        RETURNING lease_acquired_at, lease_deadline_at
    """
    return sql, [d.offset(timeout), d.datetime_param(lifetime_end), item_id, holder, token]


# --- completion ---------------------------------------------------------------------------


def completed_set(d: Storage, output: str) -> str:
    return f"""
        {T.COMPLETE.sets()}, output_data = {output}, error_message = NULL,
        {LEASE_CLEARED}, interruptions = 0, completed_at = {d.now}, updated_at = {d.now}
    """


def complete_one(
    d: Storage, holder: str, item_id: str, token: int, output: str | None, *, plain: bool = True
) -> Statement:
    """Complete one held lease; `plain`: only if nothing depends on the item."""
    plain_sql = "AND NOT has_dependents" if plain else ""
    sql = f"""
        UPDATE work_items SET {completed_set(d, d.json())}
        WHERE work_item_id = %s AND {fence()} {plain_sql}
        RETURNING work_item_id, lease_token, status, retry_count, run_after, has_dependents
    """
    return sql, [output, item_id, holder, token]


# --- the end of a failed attempt, a hand-back ------------------------------------------------


def attempt_ended_set(
    d: Storage,
    transition: T.Transition,
    *,
    retrying: str,
    run_after: str,
    error: str,
    superseded_by: str,
    row: str = "",
    note_retry: bool = False,
) -> str:
    """SET list for an attempt that ended badly: back to `pending` or `failed` for good.

    `retrying` is a boolean SQL expression (retries left and the policy
    allows one); `run_after` is when a retry becomes claimable; `error` the
    message; `superseded_by` the other holder of the item's unique key (SQL,
    NULL when none): an item that would be retried while another holds its
    key ends failed instead, superseded by it. An item asked to stop
    (`cancel_requested_at`) ends cancelled, whatever else. With
    `note_retry`, the message of an item that goes back to pending (and only
    of one that does) ends with "- retry n/m". Shared by a worker's failed
    release and the sweep's recovery.
    """
    p = f"{row}." if row else ""
    cancelled = cancel_requested(row)
    returns = f"(NOT {cancelled} AND ({retrying}) AND {superseded_by} IS NULL)"
    superseded = f"(NOT {cancelled} AND ({retrying}) AND {superseded_by} IS NOT NULL)"
    note = f" || CASE WHEN {returns} THEN {retry_note(row)} ELSE '' END" if note_retry else ""
    return f"""
        {transition.sets({T.CANCELLED: cancelled, T.PENDING: returns})},
        retry_count = CASE WHEN {returns} THEN {p}retry_count + 1 ELSE {p}retry_count END,
        run_after = CASE WHEN {returns} THEN {run_after} ELSE {p}run_after END,
        completed_at = CASE WHEN {returns} THEN NULL ELSE {d.now} END,
        error_message = CASE WHEN {cancelled} THEN {cancelled_message(error)}
                        WHEN {superseded} THEN {superseded_message(superseded_by, error)}
                        ELSE {error}{note} END,
        interruptions = 0, {LEASE_CLEARED}, updated_at = {d.now}
    """


def retry_note(row: str = "") -> str:
    """SQL: " - retry n/m", the retry an item going back to pending is on (read in a SET
    list, `retry_count` is the row's value before the update)."""
    p = f"{row}." if row else ""
    return f"' - retry ' || CAST({p}retry_count + 1 AS TEXT) || '/' || CAST({p}max_retries AS TEXT)"


def cancel_requested(row: str = "") -> str:
    """SQL: the item was asked to stop (`leasing.cancel()` of a running item)."""
    return f"({row + '.' if row else ''}cancel_requested_at IS NOT NULL)"


def cancelled_message(error: str) -> str:
    """SQL: the error message of a run that ended after it was asked to stop."""
    return f"'Cancelled as asked; the run ended with: ' || COALESCE({error}, '')"


# What a worker's ending returns: the outcome, the message it stored (its checkpoint
# records that one), and who superseded the item (if anyone).
_ENDING_COLUMNS = (
    "work_item_id, lease_token, status, retry_count, run_after, has_dependents, error_message"
)


def _superseded_by(row: str, retrying: str = "1 = 1") -> str:
    """RETURNING: the holder that superseded the item, else NULL.

    Superseded: it would have returned to pending (`retrying`, unchanged by
    the update when it did not) but ended failed while another holds its key.
    """
    return (
        f"CASE WHEN status = {FAILED} AND ({retrying}) THEN {other_holder(row)} END "
        "AS superseded_by"
    )


def end_attempt(
    d: Storage,
    holder: str,
    item_id: str,
    token: int,
    *,
    retry: bool,
    backoff_seconds: float,
    error: str | None,
    plain: bool = True,
    note_retry: bool = False,
) -> Statement:
    """End a failed attempt: retried after a backoff while retries are left, else failed.

    Superseded (failed) instead of retried while another item holds its
    unique key. `plain`: only if nothing depends on the item (see `complete_one`).
    `note_retry`: the message says "- retry n/m" if the item goes back to pending.
    """
    retrying = "retry_count < max_retries" if retry else "1 = 0"
    set_sql = attempt_ended_set(
        d,
        T.FAIL_ATTEMPT,
        retrying=retrying,
        run_after=d.clock(),
        error="%s",
        superseded_by=other_holder("work_items"),
        note_retry=note_retry,
    )
    plain_sql = "AND NOT has_dependents" if plain else ""
    sql = f"""
        UPDATE work_items SET {set_sql}
        WHERE work_item_id = %s AND {fence()} {plain_sql}
        RETURNING {_ENDING_COLUMNS}, {_superseded_by("work_items", retrying)}
    """
    # `run_after`'s offset, then the message three times (cancelled, superseded, or not).
    return sql, [d.offset(backoff_seconds), error, error, error, item_id, holder, token]


def requeue(
    d: Storage, holder: str, item_id: str, token: int, *, interrupted: bool, error: str | None
) -> Statement:
    """Give a held item back to `pending` without counting a retry.

    A shutting-down worker hands back what it did not finish; an attempt cut
    short by the database (a lost connection, a lock timeout) is
    `interrupted`: it counts in `interruptions`, not in `retry_count`. While
    another item holds its unique key it is superseded (failed) instead, and
    an item asked to stop ends cancelled.
    """
    set_sql, set_params = _handed_back_set(d, "%s" if interrupted else "error_message")
    interruptions = "interruptions + 1" if interrupted else "interruptions"
    sql = f"""
        UPDATE work_items
        SET {set_sql}, interruptions = {interruptions}
        WHERE work_item_id = %s AND {fence()}
        RETURNING {_ENDING_COLUMNS}, queue_name, {_superseded_by("work_items")}
    """
    why = error if interrupted else "handed back unfinished"
    params = [*([error] if interrupted else []), *[why] * set_params]
    return sql, [*params, item_id, holder, token]


def _handed_back_set(d: Storage, message: str) -> tuple[str, int]:
    """SET list of a hand-back and how many times it takes the reason (`%s`) after `message`.

    Back to pending, unless the item was asked to stop (cancelled) or another
    item holds its unique key (superseded: failed).
    """
    holder_sql = other_holder("work_items")
    cancelled = cancel_requested()
    returns = f"(NOT {cancelled} AND {holder_sql} IS NULL)"
    sql = f"""
        {T.HAND_BACK.sets({T.CANCELLED: cancelled, T.PENDING: returns})}, {LEASE_CLEARED},
        error_message = CASE WHEN {returns} THEN {message}
                        WHEN {cancelled} THEN {cancelled_message("%s")}
                        ELSE {superseded_message(holder_sql, "%s")} END,
        completed_at = CASE WHEN {returns} THEN NULL ELSE {d.now} END,
        updated_at = {d.now}
    """
    return sql, 2


def requeue_all(d: Storage, holder: str, keys: list[tuple[str, int]]) -> Statement:
    """Hand these held leases back at once (a forced stop): `requeue` for many, in one statement.

    An item that would be superseded while something depends on it is left
    alone: its dependents must be settled with it, which the sweep does when
    its lease runs out.
    """
    set_sql, reasons = _handed_back_set(d, "error_message")
    holder_sql = other_holder("work_items")
    source, source_params = d.rows_table("k", [("id", "text"), ("token", "bigint")], keys)
    sql = f"""
        UPDATE work_items
        SET {set_sql}
        WHERE lease_holder = %s AND {T.HAND_BACK.leaves()}
          AND work_item_id IN (SELECT k.id FROM {source})
          AND lease_token = (SELECT k.token FROM {source} WHERE k.id = work_items.work_item_id)
          AND NOT (has_dependents AND ({holder_sql} IS NOT NULL OR {cancel_requested()}))
        RETURNING work_item_id, lease_token, status, queue_name
    """
    why = "handed back by a forced stop"
    return sql, [*[why] * reasons, holder, *source_params, *source_params]


def expire_earlier_leases(d: Storage, holder: str) -> Statement:
    """Expire the live leases `holder` took before its process registered: a worker id's
    earlier process held them and nothing renews them now, so the sweep recovers them at
    its next pass (as when that process's leases run out)."""
    sql = f"""
        UPDATE work_items SET lease_expires_at = {d.now}
        WHERE lease_holder = %s AND status = {IN_PROGRESS} AND lease_expires_at > {d.now}
          AND lease_acquired_at < (SELECT w.started_at FROM workers AS w WHERE w.worker_id = %s)
        RETURNING work_item_id
    """
    return sql, [holder, holder]


# --- reads that decide a write ---------------------------------------------------------------


def cancel_requests(d: Storage, holder: str) -> Statement:
    """The leases of `holder` whose items were asked to stop (`leasing.cancel()`)."""
    sql = f"""
        SELECT work_item_id, lease_token FROM work_items
        WHERE lease_holder = %s AND status = {IN_PROGRESS} AND cancel_requested_at IS NOT NULL
    """
    return sql, [holder]


def lease_state(d: Storage, item_id: str) -> Statement:
    """Why a fenced write matched no row: the item's lease as it is now."""
    sql = f"""
        SELECT status, lease_holder, lease_token,
               CASE WHEN lease_expires_at > {d.now} THEN 1 ELSE 0 END AS live,
               CASE WHEN lease_deadline_at <= {d.now} THEN 1 ELSE 0 END AS past_deadline
        FROM work_items WHERE work_item_id = %s
    """
    return sql, [item_id]


def exists(item_id: str) -> Statement:
    return "SELECT task_id FROM work_items WHERE work_item_id = %s", [item_id]
