"""Leases: claiming work items, renewing and releasing them (SPEC §6).

Every transition is one conditional UPDATE. A claim is a compare-and-swap on
`status = 'pending'` (with `FOR UPDATE SKIP LOCKED` on PostgreSQL, so
concurrent claimers never wait for or share a row); renewals and releases
match `lease_holder`, `lease_token` and `status = 'in_progress'`, so a worker
whose lease was swept and re-claimed (a zombie) cannot change the row again.
All lease times come from the database clock.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db import transaction

from . import validation
from .conf import get_settings
from .db import Dialect, execute, load_json, to_datetime
from .enqueue import notify_enqueued
from .exceptions import (
    InvalidInput,
    LeaseConflictError,
    LeaseExpiredError,
    LeaseLostError,
    WorkItemNotFound,
)
from .models import WorkItemStatus

logger = logging.getLogger(__name__)

MAX_BATCH = 1000


@dataclass(frozen=True, slots=True)
class Lease:
    """A claimed work item, as the claim left it."""

    work_item_id: str
    task_id: str
    work_type: str
    queue_name: str
    priority: int
    input_data: Any
    token: int
    worker_id: str
    acquired_at: datetime
    expires_at: datetime
    retry_count: int
    max_retries: int
    created_at: datetime

    @property
    def id(self) -> str:
        return self.work_item_id


@dataclass(frozen=True, slots=True)
class _ClaimStatement:
    ctes: str
    sqlite_sql: str
    params: list[Any]


@dataclass(frozen=True, slots=True)
class ReleaseOutcome:
    """What a release did: the item's new status, retry count and `run_after`."""

    work_item_id: str
    status: str
    retry_count: int
    run_after: datetime | None

    @property
    def will_retry(self) -> bool:
        return self.status == WorkItemStatus.PENDING


def retry_backoff_seconds(retry_count: int) -> float:
    """Exponential backoff with jitter for the retry after `retry_count` retries.

    base * 2**retry_count, capped at RETRY_BACKOFF_MAX, then spread by
    +/- RETRY_JITTER so that items failing together do not retry together.
    """
    conf = get_settings()
    delay = min(conf.retry_backoff_base * (2 ** min(retry_count, 60)), conf.retry_backoff_max)
    spread = delay * conf.retry_jitter
    return max(0.0, delay + random.uniform(-spread, spread))


_RETURNING = (
    "work_item_id, task_id, work_type, queue_name, priority, input_data, lease_token, "
    "lease_acquired_at, lease_expires_at, retry_count, max_retries, created_at"
)


class LeaseManager:
    """Claims, renews and releases leases for one worker id.

    The manager remembers the fencing token of every lease it acquired and
    sends it with each renewal and release. It is thread-safe: one manager
    can serve all the threads of a worker process (each thread uses its own
    database connection, as Django gives every thread its own).
    """

    def __init__(self, worker_id: str, using: str = "default") -> None:
        self.worker_id = validation.non_empty_text("worker_id", worker_id)
        self.using = using
        self._held: dict[str, Lease] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<LeaseManager worker_id={self.worker_id!r} held={len(self._held)}>"

    # --- bookkeeping -----------------------------------------------------------------

    def held_leases(self) -> list[Lease]:
        """The leases this manager acquired and has not released or lost."""
        with self._lock:
            return list(self._held.values())

    def lease_for(self, work_item_id: str) -> Lease | None:
        with self._lock:
            return self._held.get(work_item_id)

    def forget(self, work_item_id: str) -> None:
        """Drop a lease from the manager's memory (after it was lost)."""
        with self._lock:
            self._held.pop(work_item_id, None)

    def _remember(self, leases: Iterable[Lease]) -> None:
        with self._lock:
            for lease in leases:
                self._held[lease.work_item_id] = lease

    def _token(self, work_item_id: str, token: int | None) -> int | None:
        if token is not None:
            return validation.integer("token", token, minimum=0)
        with self._lock:
            lease = self._held.get(work_item_id)
        return lease.token if lease else None

    # --- claiming ---------------------------------------------------------------------

    def acquire_lease(
        self,
        lease_duration_seconds: float | None = None,
        work_type_filter: str | Sequence[str] | None = None,
        task_id_filter: str | None = None,
        queue_filter: str | Sequence[str] | None = None,
    ) -> Lease | None:
        """Claim the highest-priority, oldest claimable item, or return None."""
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
        *,
        lease_durations: Mapping[str, float] | None = None,
    ) -> list[Lease]:
        """Claim up to `n` items in one statement, in claim order.

        `lease_durations` gives some work types their own lease duration
        (`lease_duration_seconds` is the rest's), still in one statement.
        """
        claim = self._claim_statement(
            n,
            lease_duration_seconds,
            work_type_filter,
            task_id_filter,
            queue_filter,
            lease_durations,
        )
        d = Dialect(self.using)
        if d.is_postgres:
            sql = f"""
                WITH {claim.ctes}
                SELECT {_RETURNING} FROM claimed
            """
        else:
            sql = claim.sqlite_sql
        # One statement is its own transaction; inside a caller's atomic()
        # block it joins that transaction instead.
        rows = execute(self.using, sql, claim.params)
        return self._leases_from_rows(rows)

    def complete_and_acquire(
        self,
        results: Sequence[tuple[str, str | None]],
        n: int,
        lease_duration_seconds: float | None = None,
        work_type_filter: str | Sequence[str] | None = None,
        task_id_filter: str | None = None,
        queue_filter: str | Sequence[str] | None = None,
        *,
        lease_durations: Mapping[str, float] | None = None,
    ) -> tuple[list[str], list[str], list[Lease]]:
        """Complete finished items and claim new ones in one round trip.

        On PostgreSQL both are data-modifying CTEs of one statement, so a busy
        worker pays one commit per batch instead of two per item; they touch
        disjoint rows (held `in_progress` vs `pending`). Same fencing as
        `complete_many()` and `acquire_leases()`. Returns
        `(completed_ids, lost_ids, new_leases)`.
        """
        if not results or not Dialect(self.using).is_postgres:
            completed, lost = self.complete_many(results)
            leases = self.acquire_leases(
                n,
                lease_duration_seconds,
                work_type_filter,
                task_id_filter,
                queue_filter,
                lease_durations=lease_durations,
            )
            return completed, lost, leases
        claim = self._claim_statement(
            n,
            lease_duration_seconds,
            work_type_filter,
            task_id_filter,
            queue_filter,
            lease_durations,
        )
        tokens, lost = self._tokens_for(results)
        todo = [(item_id, output) for item_id, output in results if item_id in tokens]
        d = Dialect(self.using)
        nulls = ", ".join(["NULL"] * (len(_RETURNING.split(",")) - 1))
        rows = execute(
            self.using,
            f"""
            WITH done AS ({_complete_batch_sql(d)}),
            {claim.ctes}
            SELECT 'claimed' AS kind, {_RETURNING} FROM claimed
            UNION ALL
            SELECT 'done', work_item_id, {nulls} FROM done
            """,
            [
                [item_id for item_id, _ in todo],
                [tokens[item_id] for item_id, _ in todo],
                [output for _, output in todo],
                self.worker_id,
                *claim.params,
            ],
        )
        completed = [row["work_item_id"] for row in rows if row["kind"] == "done"]
        done = set(completed)
        lost += [item_id for item_id, _ in todo if item_id not in done]
        with self._lock:
            for item_id, _ in results:
                self._held.pop(item_id, None)
        leases = self._leases_from_rows([row for row in rows if row["kind"] == "claimed"])
        return completed, lost, leases

    def _claim_statement(
        self,
        n: int,
        lease_duration_seconds: float | None,
        work_type_filter: str | Sequence[str] | None,
        task_id_filter: str | None,
        queue_filter: str | Sequence[str] | None,
        lease_durations: Mapping[str, float] | None = None,
    ) -> _ClaimStatement:
        """The validated claim: CTEs `candidate` + `claimed` (PostgreSQL) or one UPDATE."""
        n = validation.integer("n", n, minimum=1, maximum=MAX_BATCH)
        duration = validation.positive_seconds(
            "lease_duration_seconds",
            get_settings().lease_duration
            if lease_duration_seconds is None
            else lease_duration_seconds,
        )
        work_types = validation.text_filter("work_type_filter", work_type_filter)
        queues = validation.text_filter("queue_filter", queue_filter)
        task_ids = (
            None
            if task_id_filter is None
            else [validation.non_empty_text("task_id_filter", task_id_filter)]
        )

        d = Dialect(self.using)
        filters: list[str] = []
        filter_params: list[Any] = []
        for column, values in (
            ("work_type", work_types),
            ("queue_name", queues),
            ("task_id", task_ids),
        ):
            if values is not None:
                clause, params = d.in_list(column, values)
                filters.append(f"AND {clause}")
                filter_params += params
        where = " ".join(filters)
        expiry_sql = d.now_plus()
        expiry_params: list[Any] = [d.seconds(duration)]
        overrides = {
            validation.non_empty_text("lease_durations key", work_type): (
                validation.positive_seconds(f"lease_durations[{work_type!r}]", seconds)
            )
            for work_type, seconds in (lease_durations or {}).items()
        }
        overrides = {t: s for t, s in overrides.items() if s != duration}
        if overrides:
            whens = " ".join(f"WHEN %s THEN {d.now_plus()}" for _ in overrides)
            expiry_sql = f"CASE work_type {whens} ELSE {d.now_plus()} END"
            expiry_params = [
                *(value for t, s in overrides.items() for value in (t, d.seconds(s))),
                d.seconds(duration),
            ]
        set_clause = f"""
            status = 'in_progress',
            lease_holder = %s,
            lease_token = lease_token + 1,
            lease_acquired_at = {d.now},
            lease_expires_at = {expiry_sql},
            heartbeat_at = {d.now},
            progress_at = NULL,
            started_at = COALESCE(started_at, {d.now}),
            updated_at = {d.now}
        """
        set_params = [self.worker_id, *expiry_params]
        candidates = f"""
            SELECT work_item_id FROM work_items
            WHERE status = 'pending'
              AND (run_after IS NULL OR run_after <= {d.now})
              {where}
            ORDER BY priority DESC, created_at, work_item_id
            LIMIT %s
        """
        # PostgreSQL: the candidate rows are locked and skipped by concurrent
        # claimers, so no two claims can pick the same row and none waits.
        ctes = f"""
            candidate AS ({candidates} FOR UPDATE SKIP LOCKED),
            claimed AS (
                UPDATE work_items SET {set_clause}
                FROM candidate
                WHERE work_items.work_item_id = candidate.work_item_id
                RETURNING {", ".join("work_items." + c.strip() for c in _RETURNING.split(","))}
            )
        """
        # SQLite has one writer at a time; the status re-check makes the
        # UPDATE a compare-and-swap even if the subquery saw an older row.
        sqlite_sql = f"""
            UPDATE work_items SET {set_clause}
            WHERE work_item_id IN ({candidates}) AND status = 'pending'
            RETURNING {_RETURNING}
        """
        return _ClaimStatement(
            ctes=ctes,
            sqlite_sql=sqlite_sql,
            params=(
                [*filter_params, n, *set_params]
                if d.is_postgres
                else [*set_params, *filter_params, n]
            ),
        )

    def _leases_from_rows(self, rows: list[dict[str, Any]]) -> list[Lease]:
        leases = sorted(
            (self._lease_from_row(row) for row in rows),
            key=lambda lease: (-lease.priority, lease.created_at, lease.work_item_id),
        )
        self._remember(leases)
        return leases

    def _tokens_for(self, results: Sequence[tuple[str, Any]]) -> tuple[dict[str, int], list[str]]:
        with self._lock:
            tokens = {
                item_id: self._held[item_id].token
                for item_id, _ in results
                if item_id in self._held
            }
        return tokens, [item_id for item_id, _ in results if item_id not in tokens]

    def _lease_from_row(self, row: dict[str, Any]) -> Lease:
        return Lease(
            work_item_id=row["work_item_id"],
            task_id=row["task_id"],
            work_type=row["work_type"],
            queue_name=row["queue_name"],
            priority=row["priority"],
            input_data=load_json(row["input_data"]),
            token=row["lease_token"],
            worker_id=self.worker_id,
            acquired_at=to_datetime(row["lease_acquired_at"]),  # type: ignore[arg-type]
            expires_at=to_datetime(row["lease_expires_at"]),  # type: ignore[arg-type]
            retry_count=row["retry_count"],
            max_retries=row["max_retries"],
            created_at=to_datetime(row["created_at"]),  # type: ignore[arg-type]
        )

    # --- renewing ---------------------------------------------------------------------

    def renew_lease(
        self,
        work_item_id: str,
        lease_duration_seconds: float | None = None,
        *,
        token: int | None = None,
        progress_age_seconds: float | None = None,
    ) -> bool:
        """Extend a held lease to now + duration (database clock).

        `progress_age_seconds` records the handler's last proof of work as
        `progress_at = now - age`, translating the worker's monotonic clock
        into database time without trusting the worker's wall clock.

        Raises `LeaseExpiredError` if the lease already ran out (a late renewal
        never resurrects it), `LeaseConflictError` if another worker holds the
        item or its token moved on, `WorkItemNotFound` for an unknown id.
        """
        work_item_id = validation.non_empty_text("work_item_id", work_item_id)
        duration = validation.positive_seconds(
            "lease_duration_seconds",
            get_settings().lease_duration
            if lease_duration_seconds is None
            else lease_duration_seconds,
        )
        if progress_age_seconds is not None and (
            isinstance(progress_age_seconds, bool)
            or not isinstance(progress_age_seconds, int | float)
            or progress_age_seconds < 0
        ):
            raise InvalidInput(
                f"progress_age_seconds must be a non-negative number, got {progress_age_seconds!r}."
            )
        held_token = self._token(work_item_id, token)
        if held_token is None:
            self._raise_lease_error(work_item_id, None, renewing=True)

        d = Dialect(self.using)
        progress_sql = ""
        progress_params: list[Any] = []
        if progress_age_seconds is not None:
            progress_sql = f", progress_at = {d.now_minus()}"
            progress_params = [d.seconds(progress_age_seconds, sign=-1)]
        rows = execute(
            self.using,
            f"""
            UPDATE work_items
            SET lease_expires_at = {d.now_plus()}, heartbeat_at = {d.now},
                updated_at = {d.now}{progress_sql}
            WHERE work_item_id = %s AND lease_holder = %s AND lease_token = %s
              AND status = 'in_progress' AND lease_expires_at > {d.now}
            RETURNING lease_expires_at
            """,
            [d.seconds(duration), *progress_params, work_item_id, self.worker_id, held_token],
        )
        if not rows:
            self._raise_lease_error(work_item_id, held_token, renewing=True)
        self._update_expiry(work_item_id, to_datetime(rows[0]["lease_expires_at"]))
        return True

    def renew_leases(
        self,
        work_item_ids: Iterable[str] | None = None,
        lease_duration_seconds: float | None = None,
        *,
        progress_ages: dict[str, float] | None = None,
        extend_below: float | None = None,
    ) -> tuple[set[str], set[str]]:
        """Renew many held leases in one statement (all held leases by default).

        With `extend_below`, a lease with more than that many seconds left keeps
        its expiry and only records the heartbeat: `lease_expires_at` is indexed,
        so an UPDATE that leaves it alone can be a HOT update (no index writes),
        while an extension cannot. The worker passes half the lease, so a lease
        never has less than half its duration ahead minus one heartbeat interval.

        Returns `(renewed, lost)`: the ids whose lease is held (extended or
        still long enough), and the ids whose lease had expired or moved on.
        Lost leases are forgotten.
        """
        duration = validation.positive_seconds(
            "lease_duration_seconds",
            get_settings().lease_duration
            if lease_duration_seconds is None
            else lease_duration_seconds,
        )
        threshold = (
            duration
            if extend_below is None
            else min(validation.positive_seconds("extend_below", extend_below), duration)
        )
        with self._lock:
            if work_item_ids is None:
                targets = {i: lease.token for i, lease in self._held.items()}
            else:
                targets = {i: self._held[i].token for i in work_item_ids if i in self._held}
        if not targets:
            return set(), set()
        progress_ages = progress_ages or {}
        d = Dialect(self.using)
        ids = list(targets)
        renewed: dict[str, datetime | None] = {}
        for start in range(0, len(ids), MAX_BATCH):
            chunk = ids[start : start + MAX_BATCH]
            if d.is_postgres:
                rows = execute(
                    self.using,
                    f"""
                    UPDATE work_items AS w
                    SET lease_expires_at = CASE
                            WHEN w.lease_expires_at < {d.now_plus()} THEN {d.now_plus()}
                            ELSE w.lease_expires_at END,
                        heartbeat_at = {d.now}, updated_at = {d.now},
                        progress_at = CASE WHEN v.age IS NULL THEN w.progress_at
                                           ELSE {d.now} - make_interval(secs => v.age) END
                    FROM unnest(%s::text[], %s::bigint[], %s::float8[]) AS v(id, token, age)
                    WHERE w.work_item_id = v.id AND w.lease_token = v.token
                      AND w.lease_holder = %s AND w.status = 'in_progress'
                      AND w.lease_expires_at > {d.now}
                    RETURNING w.work_item_id, w.lease_expires_at
                    """,
                    [
                        d.seconds(threshold),
                        d.seconds(duration),
                        chunk,
                        [targets[i] for i in chunk],
                        [progress_ages.get(i) for i in chunk],
                        self.worker_id,
                    ],
                )
                for row in rows:
                    renewed[row["work_item_id"]] = to_datetime(row["lease_expires_at"])
            else:
                with transaction.atomic(using=self.using):
                    for item_id in chunk:
                        age = progress_ages.get(item_id)
                        progress_sql = "" if age is None else f", progress_at = {d.now_minus()}"
                        rows = execute(
                            self.using,
                            f"""
                            UPDATE work_items
                            SET lease_expires_at = CASE
                                    WHEN lease_expires_at < {d.now_plus()} THEN {d.now_plus()}
                                    ELSE lease_expires_at END,
                                heartbeat_at = {d.now}, updated_at = {d.now}{progress_sql}
                            WHERE work_item_id = %s AND lease_holder = %s
                              AND lease_token = %s AND status = 'in_progress'
                              AND lease_expires_at > {d.now}
                            RETURNING lease_expires_at
                            """,
                            [
                                d.seconds(threshold),
                                d.seconds(duration),
                                *([] if age is None else [d.seconds(age, sign=-1)]),
                                item_id,
                                self.worker_id,
                                targets[item_id],
                            ],
                        )
                        if rows:
                            renewed[item_id] = to_datetime(rows[0]["lease_expires_at"])
        lost = set(targets) - set(renewed)
        with self._lock:
            for item_id, expires_at in renewed.items():
                lease = self._held.get(item_id)
                if lease is not None and expires_at is not None:
                    self._held[item_id] = _replace_expiry(lease, expires_at)
            for item_id in lost:
                self._held.pop(item_id, None)
        return set(renewed), lost

    def _update_expiry(self, work_item_id: str, expires_at: datetime | None) -> None:
        with self._lock:
            lease = self._held.get(work_item_id)
            if lease is not None and expires_at is not None:
                self._held[work_item_id] = _replace_expiry(lease, expires_at)

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
    ) -> bool:
        """Finish a held lease.

        Success: `completed` with the output stored. Failure: `failed`, or with
        `retry=True` and retries left, back to `pending` with `retry_count + 1`
        and `run_after` set by exponential backoff with jitter. A worker that no
        longer holds the lease changes nothing and gets `LeaseLostError`.
        """
        self.release(
            work_item_id, success, output_data=output_data, error=error, retry=retry, token=token
        )
        return True

    def release(
        self,
        work_item_id: str,
        success: bool,
        *,
        output_data: Any = None,
        error: str | BaseException | None = None,
        retry: bool = False,
        token: int | None = None,
    ) -> ReleaseOutcome:
        """`release_lease()` returning what happened to the item."""
        work_item_id = validation.non_empty_text("work_item_id", work_item_id)
        if not isinstance(success, bool):
            raise InvalidInput(f"success must be True or False, got {success!r}.")
        output_json = validation.payload("output_data", output_data)
        error_text = _error_text(error)
        held_token = self._token(work_item_id, token)
        if held_token is None:
            self._raise_lease_error(work_item_id, None, renewing=False)
        lease = self.lease_for(work_item_id)

        d = Dialect(self.using)
        if success:
            sql = f"""
                UPDATE work_items
                SET status = 'completed', output_data = {d.json_param()}, error_message = NULL,
                    lease_holder = NULL, lease_expires_at = NULL,
                    completed_at = {d.now}, updated_at = {d.now}
                WHERE work_item_id = %s AND lease_holder = %s AND lease_token = %s
                  AND status = 'in_progress'
                RETURNING work_item_id, status, retry_count, run_after
            """
            params: list[Any] = [output_json, work_item_id, self.worker_id, held_token]
        else:
            # retry_count cannot change while we hold the lease, so the backoff
            # computed from the claim's count is the one the CASE applies.
            retry_count = lease.retry_count if lease else 0
            retrying = "(%s AND retry_count < max_retries)"
            sql = f"""
                UPDATE work_items
                SET status = CASE WHEN {retrying} THEN 'pending' ELSE 'failed' END,
                    retry_count = CASE WHEN {retrying} THEN retry_count + 1 ELSE retry_count END,
                    run_after = CASE WHEN {retrying} THEN {d.now_plus()} ELSE run_after END,
                    completed_at = CASE WHEN {retrying} THEN NULL ELSE {d.now} END,
                    output_data = {d.json_param()}, error_message = %s,
                    lease_holder = NULL, lease_expires_at = NULL, updated_at = {d.now}
                WHERE work_item_id = %s AND lease_holder = %s AND lease_token = %s
                  AND status = 'in_progress'
                RETURNING work_item_id, status, retry_count, run_after
            """
            backoff = d.seconds(retry_backoff_seconds(retry_count))
            # One flag per CASE, in statement order; run_after's also takes the backoff.
            params = [retry, retry, retry, backoff, retry]
            params += [output_json, error_text, work_item_id, self.worker_id, held_token]
        rows = execute(self.using, sql, params)
        if not rows:
            self._raise_lease_error(work_item_id, held_token, renewing=False)
        self.forget(work_item_id)
        row = rows[0]
        return ReleaseOutcome(
            work_item_id=row["work_item_id"],
            status=row["status"],
            retry_count=row["retry_count"],
            run_after=to_datetime(row["run_after"]),
        )

    def complete_many(
        self, results: Sequence[tuple[str, str | None]]
    ) -> tuple[list[str], list[str]]:
        """Complete many held leases in one statement.

        `results` holds `(work_item_id, output_json)` pairs, the output already
        encoded (and size-checked) by `validation.payload`. Each row is fenced
        like `release_lease`; returns `(completed_ids, lost_ids)`, where lost
        ids are leases that moved on (their results are discarded).
        """
        if not results:
            return [], []
        tokens, lost = self._tokens_for(results)
        todo = [(item_id, output) for item_id, output in results if item_id in tokens]
        d = Dialect(self.using)
        completed: list[str] = []
        for start in range(0, len(todo), MAX_BATCH):
            chunk = todo[start : start + MAX_BATCH]
            if d.is_postgres:
                rows = execute(
                    self.using,
                    _complete_batch_sql(d),
                    [
                        [item_id for item_id, _ in chunk],
                        [tokens[item_id] for item_id, _ in chunk],
                        [output for _, output in chunk],
                        self.worker_id,
                    ],
                )
                completed += [row["work_item_id"] for row in rows]
            else:
                with transaction.atomic(using=self.using):
                    for item_id, output in chunk:
                        if execute(
                            self.using,
                            f"""
                            UPDATE work_items
                            SET status = 'completed', output_data = %s, error_message = NULL,
                                lease_holder = NULL, lease_expires_at = NULL,
                                completed_at = {d.now}, updated_at = {d.now}
                            WHERE work_item_id = %s AND lease_holder = %s AND lease_token = %s
                              AND status = 'in_progress'
                            RETURNING work_item_id
                            """,
                            [output, item_id, self.worker_id, tokens[item_id]],
                        ):
                            completed.append(item_id)
        done = set(completed)
        lost += [item_id for item_id, _ in todo if item_id not in done]
        with self._lock:
            for item_id, _ in results:
                self._held.pop(item_id, None)
        return completed, lost

    def requeue_lease(self, work_item_id: str, *, token: int | None = None) -> bool:
        """Give a held item back to `pending` without counting a retry.

        Used by a worker shutting down with items it has not finished.
        """
        work_item_id = validation.non_empty_text("work_item_id", work_item_id)
        held_token = self._token(work_item_id, token)
        if held_token is None:
            self._raise_lease_error(work_item_id, None, renewing=False)
        d = Dialect(self.using)
        with transaction.atomic(using=self.using):
            rows = execute(
                self.using,
                f"""
                UPDATE work_items
                SET status = 'pending', lease_holder = NULL, lease_expires_at = NULL,
                    updated_at = {d.now}
                WHERE work_item_id = %s AND lease_holder = %s AND lease_token = %s
                  AND status = 'in_progress'
                RETURNING work_item_id, queue_name
                """,
                [work_item_id, self.worker_id, held_token],
            )
            if rows:
                # Another worker can start it now; do not make it wait for a poll.
                notify_enqueued(self.using, [rows[0]["queue_name"]])
        if not rows:
            self._raise_lease_error(work_item_id, held_token, renewing=False)
        self.forget(work_item_id)
        return True

    # --- diagnosing a refused write ----------------------------------------------------------

    def _raise_lease_error(self, work_item_id: str, token: int | None, *, renewing: bool) -> None:
        """Raise the specific error for a fenced write that matched no row."""
        d = Dialect(self.using)
        rows = execute(
            self.using,
            f"""
            SELECT status, lease_holder, lease_token,
                   CASE WHEN lease_expires_at > {d.now} THEN 1 ELSE 0 END AS live
            FROM work_items WHERE work_item_id = %s
            """,
            [work_item_id],
        )
        if not rows:
            raise WorkItemNotFound(work_item_id)
        self.forget(work_item_id)
        row = rows[0]
        status, holder, current = row["status"], row["lease_holder"], row["lease_token"]
        if token is None:
            raise LeaseConflictError(
                f"Worker {self.worker_id!r} holds no lease on work item {work_item_id!r} "
                f"(status {status}, holder {holder!r})."
            )
        mine = holder == self.worker_id and current == token
        if status == WorkItemStatus.IN_PROGRESS and mine and not row["live"]:
            error: type[Exception] = LeaseExpiredError if renewing else LeaseLostError
            raise error(
                f"The lease of worker {self.worker_id!r} on work item {work_item_id!r} "
                f"(token {token}) has expired."
            )
        if status == WorkItemStatus.IN_PROGRESS and not mine:
            error = LeaseConflictError if renewing else LeaseLostError
            raise error(
                f"Work item {work_item_id!r} is held by {holder!r} with token {current}; "
                f"worker {self.worker_id!r} had token {token}."
            )
        raise LeaseLostError(
            f"Worker {self.worker_id!r} no longer holds work item {work_item_id!r} "
            f"(token {token}): it is now {status}"
            + (f" with token {current}" if current != token else "")
            + "."
        )


def _complete_batch_sql(d: Dialect) -> str:
    """PostgreSQL: complete held leases given as (ids, tokens, outputs) arrays and the holder.

    Fenced per row like `release_lease()`; returns the ids it completed.
    """
    return f"""
        UPDATE work_items AS w
        SET status = 'completed', output_data = v.output::jsonb,
            error_message = NULL, lease_holder = NULL, lease_expires_at = NULL,
            completed_at = {d.now}, updated_at = {d.now}
        FROM unnest(%s::text[], %s::bigint[], %s::text[]) AS v(id, token, output)
        WHERE w.work_item_id = v.id AND w.lease_token = v.token
          AND w.lease_holder = %s AND w.status = 'in_progress'
        RETURNING w.work_item_id
    """


def _replace_expiry(lease: Lease, expires_at: datetime) -> Lease:
    return replace(lease, expires_at=expires_at)


def _error_text(error: str | BaseException | None) -> str | None:
    if error is None:
        return None
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {error}"
    elif isinstance(error, str):
        text = error
    else:
        raise InvalidInput(f"error must be a string or an exception, got {error!r}.")
    # Bound the column: a traceback belongs in the error_boundary checkpoint.
    return text[:10_000]


__all__ = ["Lease", "LeaseManager", "ReleaseOutcome", "retry_backoff_seconds"]
