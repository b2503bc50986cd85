"""The recovery sweep, or watchdog (SPEC §9): expired leases back to work.

A worker that dies or hangs stops renewing its lease. The sweep finds every
`in_progress` item whose lease ran out (by the database clock) and, in one
conditional UPDATE per batch:

- re-queues it as `pending` with `retry_count + 1` and
  `error_message = 'Lease expired - retry N/M'` while retries remain and the
  work type's handler allows a retry after an expired lease;
- otherwise fails it for good: `'Max retries exceeded'`, or, for a type
  registered with `on_lease_expired="fail"`, `'Lease expired - not retried
  (on_lease_expired=fail)'`;

and writes one `error_boundary` checkpoint per item in the same transaction,
naming the dead lease (holder, token, expiry, last heartbeat). The UPDATE
re-checks `status = 'in_progress'`, the expiry and the token, so an item that
its worker renewed or completed a moment earlier is left alone. Batches are
locked with `FOR NO KEY UPDATE SKIP LOCKED` on PostgreSQL, so several sweeps (and
busy workers) never wait for each other and never recover an item twice;
SQLite runs each batch in one IMMEDIATE transaction, which excludes every
other writer.

After recovering, a pass enforces checkpoint retention, deletes expired
idempotency keys and marks processes not seen for two scan intervals `lost`.

A running sweep registers in the `workers` table (role `sweeper`) and records
every pass there, which is how the dashboard knows when the watchdog last ran.
A one-off pass (`scan_and_recover()` without `start()`, `recoverysweep
--once`, the django-q2 task) records itself too, but leaves its row
`stopped`: it is a record of a pass, not a live process, so it is neither
listed as a live sweeper nor later marked `lost`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction

from . import registry, validation
from .checkpoints import cleanup_checkpoints, lock_task_sequences, task_locks_sql
from .conf import get_settings
from .db import (
    Dialect,
    database_now,
    dump_json,
    execute,
    is_transient_conflict,
    to_datetime,
    translate_db_errors,
)
from .enqueue import NOTIFY_CHANNEL
from .exceptions import DatabaseUnavailable, InvalidInput
from .idempotency import delete_expired_keys
from .ids import new_ulids
from .models import CheckpointType, Worker, WorkerRole, WorkerStatus, WorkItemStatus

logger = logging.getLogger(__name__)

# Messages written to `error_message` (and the checkpoint); the dashboard and
# the tests rely on their exact text.
RETRY_MESSAGE = "Lease expired - retry {retry_count}/{max_retries}"
MAX_RETRIES_MESSAGE = "Max retries exceeded"
FAIL_POLICY_MESSAGE = "Lease expired - not retried (on_lease_expired=fail)"

# A cleanup pass re-examines tasks whose checkpoints were created since the
# previous pass began, minus this overlap: a checkpoint's created_at is its
# statement time, and its transaction may commit a little later.
CLEANUP_OVERLAP = timedelta(seconds=60)

# SQLite binds at most 32766 parameters; a checkpoint row binds five.
MAX_BATCH_SIZE = 5000

# A batch aborted by a deadlock (busy workers' SKIP LOCKED claims can take part
# in one) is run again at once, this many times in a row at most.
MAX_CONFLICT_RETRIES = 3

# The one row django-q2 scheduled passes share (see run_sweep_pass()).
SCHEDULED_SWEEPER_ID = "sweeper@django-q"
SCHEDULE_NAME = "leasing-recovery-sweep"


@dataclass(frozen=True, slots=True)
class RecoveryStats:
    """What one pass of the sweep found and did.

    `expired_found` counts the expired rows this sweep locked (rows another
    sweep had locked are that sweep's); each is either `recovered` (back to
    `pending`) or `failed` for good, so across concurrent sweeps the sums add
    up to the number of items that expired.
    """

    expired_found: int = 0
    recovered: int = 0  # re-queued as pending
    failed: int = 0  # failed for good
    checkpoints_created: int = 0
    errors: int = 0
    scan_duration_ms: float = 0.0
    checkpoints_deleted: int = 0
    keys_expired: int = 0
    workers_lost: int = 0
    batches: int = 0
    scanned_at: datetime | None = None  # the database clock when the pass began

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (for `--json`, django-q2 and the workers table)."""
        data = dataclasses.asdict(self)
        data["scanned_at"] = None if self.scanned_at is None else self.scanned_at.isoformat()
        return data


@dataclass(slots=True)
class _PassCounters:
    expired_found: int = 0
    recovered: int = 0
    failed: int = 0
    checkpoints_created: int = 0
    errors: int = 0
    checkpoints_deleted: int = 0
    keys_expired: int = 0
    workers_lost: int = 0
    batches: int = 0
    scanned_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class _BatchOutcome:
    found: int = 0  # expired rows locked
    requeued: int = 0
    failed: int = 0
    checkpoints: int = 0


class RecoverySweep:
    """Finds expired leases and recovers them; optionally in a background thread.

    `scan_and_recover()` runs one pass in the calling thread. `start()` runs a
    pass every `scan_interval_seconds` in a daemon thread (with its own database
    connection, closed when the thread ends) until `stop()`. Database outages
    are counted as errors and survived: the broken connection is closed and the
    next pass reconnects.
    """

    def __init__(
        self,
        scan_interval_seconds: float | None = None,
        create_checkpoints: bool = True,
        cleanup_old_checkpoints: bool = True,
        checkpoint_retention_limit: int | None = None,
        using: str = "default",
        batch_size: int | None = None,
        *,
        worker_id: str | None = None,
        on_scan: Callable[[RecoveryStats], None] | None = None,
    ) -> None:
        conf = get_settings()
        self.scan_interval_seconds = validation.positive_seconds(
            "scan_interval_seconds",
            conf.sweep_interval if scan_interval_seconds is None else scan_interval_seconds,
        )
        if not isinstance(create_checkpoints, bool):
            raise InvalidInput(
                f"create_checkpoints must be True or False, got {create_checkpoints!r}."
            )
        if not isinstance(cleanup_old_checkpoints, bool):
            raise InvalidInput(
                f"cleanup_old_checkpoints must be True or False, got {cleanup_old_checkpoints!r}."
            )
        self.create_checkpoints = create_checkpoints
        self.cleanup_old_checkpoints = cleanup_old_checkpoints
        self.checkpoint_retention_limit = validation.integer(
            "checkpoint_retention_limit",
            conf.checkpoint_retention
            if checkpoint_retention_limit is None
            else checkpoint_retention_limit,
            minimum=1,
        )
        self.batch_size = validation.integer(
            "batch_size",
            conf.sweep_batch_size if batch_size is None else batch_size,
            minimum=1,
            maximum=MAX_BATCH_SIZE,
        )
        if using not in connections:
            raise InvalidInput(f"using must name a database in settings.DATABASES, got {using!r}.")
        self.using = using
        self.worker_id = (
            registry.new_worker_id(WorkerRole.SWEEPER)
            if worker_id is None
            else validation.non_empty_text("worker_id", worker_id)
        )
        if on_scan is not None and not callable(on_scan):
            raise InvalidInput(f"on_scan must be callable, got {on_scan!r}.")
        self.on_scan = on_scan

        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._scan_lock = threading.Lock()  # one pass at a time per sweep
        self._stats_lock = threading.Lock()
        self._registered = False
        self._last_cleanup_at: datetime | None = None
        self._total_scans = 0
        self._totals: dict[str, int] = dict.fromkeys(
            (
                "expired_found",
                "recovered",
                "failed",
                "checkpoints_created",
                "checkpoints_deleted",
                "keys_expired",
                "workers_lost",
                "errors",
            ),
            0,
        )
        self._last_scan: RecoveryStats | None = None

    def __repr__(self) -> str:
        return (
            f"<RecoverySweep worker_id={self.worker_id!r} "
            f"interval={self.scan_interval_seconds:g}s running={self.is_running()}>"
        )

    # --- one pass ------------------------------------------------------------------------

    def scan_and_recover(self) -> RecoveryStats:
        """Run one pass: recover expired leases, then retention, keys and lost workers."""
        with self._scan_lock:
            started = time.monotonic()
            counters = _PassCounters()
            outage = False
            try:
                counters.scanned_at = database_now(self.using)
                self._recover_expired(counters)
            except DatabaseUnavailable as exc:
                outage = True
                self._database_failed(counters, exc)
            except Exception:  # e.g. LEASING["HANDLERS"] names a module that fails to import
                counters.errors += 1
                logger.exception("recovery sweep %s: recovery failed", self.worker_id)
            for step in (self._cleanup, self._expire_keys, self._mark_lost):
                if outage or self._stopping():
                    break
                try:
                    step(counters)
                except DatabaseUnavailable as exc:
                    outage = True
                    self._database_failed(counters, exc)
                except Exception:
                    counters.errors += 1
                    logger.exception("recovery sweep %s: %s failed", self.worker_id, step.__name__)
            stats = RecoveryStats(
                scan_duration_ms=round((time.monotonic() - started) * 1000, 1),
                **dataclasses.asdict(counters),
            )
            self._account(stats)
            if not outage:
                self._record(stats)
        self._log(stats)
        if self.on_scan is not None:
            try:
                self.on_scan(stats)
            except Exception:
                logger.exception("recovery sweep %s: on_scan callback failed", self.worker_id)
        return stats

    def _recover_expired(self, counters: _PassCounters) -> None:
        """Recover expired leases batch by batch until a batch comes back short.

        A batch that PostgreSQL aborts to break a deadlock is rolled back and
        run again (up to MAX_CONFLICT_RETRIES times in a row). A batch that
        fails for any other reason but an outage is rolled back, counted and
        logged, and ends the recovery part of this pass (the same rows would
        fail again at once); the next pass retries them.
        """
        fail_types = _fail_on_expiry_types()
        conflicts = 0
        while not self._stopping():
            try:
                found = self._recover_batch(counters, fail_types)
            except DatabaseUnavailable:
                raise
            except Exception as exc:
                if is_transient_conflict(exc) and conflicts < MAX_CONFLICT_RETRIES:
                    conflicts += 1
                    logger.warning(
                        "recovery sweep %s: a batch was aborted (%s); running it again",
                        self.worker_id,
                        (str(exc).strip().splitlines() or [type(exc).__name__])[0],
                    )
                    continue
                counters.errors += 1
                logger.exception(
                    "recovery sweep %s: a batch failed and was rolled back", self.worker_id
                )
                return
            if found < self.batch_size:
                return

    def _recover_batch(self, counters: _PassCounters, fail_types: list[str]) -> int:
        """Recover one batch in one transaction; return how many expired rows it locked."""
        d = Dialect(self.using)
        with translate_db_errors(), transaction.atomic(using=self.using):
            if d.is_postgres:
                outcome = self._recover_batch_postgres(d, fail_types)
            else:
                outcome = self._recover_batch_sqlite(d, fail_types)
        # Counted only once the transaction has committed.
        counters.batches += 1
        counters.expired_found += outcome.found
        counters.recovered += outcome.requeued
        counters.failed += outcome.failed
        counters.checkpoints_created += outcome.checkpoints
        return outcome.found

    def _set_clause(self, d: Dialect) -> tuple[str, list[Any]]:
        """The SET of the recovery UPDATE; `c` is the candidate row with its decisions."""
        retry_message = (
            "'Lease expired - retry ' || CAST(w.retry_count + 1 AS TEXT) "
            "|| '/' || CAST(w.max_retries AS TEXT)"
        )
        sql = f"""
            status = CASE WHEN c.will_retry THEN 'pending' ELSE 'failed' END,
            retry_count = CASE WHEN c.will_retry THEN w.retry_count + 1 ELSE w.retry_count END,
            error_message = CASE WHEN c.will_retry THEN {retry_message}
                                 WHEN c.fail_policy THEN %s
                                 ELSE %s END,
            lease_holder = NULL,
            lease_expires_at = NULL,
            run_after = NULL,
            completed_at = CASE WHEN c.will_retry THEN NULL ELSE {d.now} END,
            updated_at = {d.now}
        """
        return sql, [FAIL_POLICY_MESSAGE, MAX_RETRIES_MESSAGE]

    def _recover_batch_postgres(self, d: Dialect, fail_types: list[str]) -> _BatchOutcome:
        """Two statements: lock a batch and its tasks; recover, checkpoint and notify.

        1. Lock the expired rows (`FOR NO KEY UPDATE SKIP LOCKED`: other sweeps
           and busy workers skip them; the lock re-checks status and expiry on
           the newest row version and holds the row until commit), then take
           their per-task checkpoint locks in sorted order. NO KEY UPDATE is
           the lock the UPDATE itself takes: it conflicts with a worker's FOR
           SHARE checkpoint fence, but not with the FOR KEY SHARE of a
           foreign-key check, so a checkpoint being inserted for a locked item
           cannot deadlock with us. The locked rows come back as one array
           literal of their row addresses (ctid), never parsed in Python, by
           which step 2 reads and updates them: a row locked by this
           transaction cannot move until it commits.
        2. One statement reads the locked rows' lease (its snapshot is taken
           after step 1's task locks, so it also sees every checkpoint
           committed so far), recovers them, writes their `error_boundary`
           checkpoints (built in SQL) and wakes idle workers for the re-queued
           ones. It returns one row of counts: nothing travels per item.
        """
        task_locks = "0"
        if self.create_checkpoints:
            # Sorted by code point, as lock_task_sequences() sorts in Python:
            # every holder of several task locks takes them in one order.
            task_locks = task_locks_sql(
                'SELECT DISTINCT task_id COLLATE "C" AS t FROM locked ORDER BY 1'
            )
        locked = execute(
            self.using,
            f"""
            WITH locked AS (
                SELECT ctid, task_id FROM work_items
                WHERE status = 'in_progress' AND lease_expires_at < {d.now}
                ORDER BY lease_expires_at
                LIMIT %s
                FOR NO KEY UPDATE SKIP LOCKED
            )
            SELECT count(*) AS found, array_agg(ctid)::text AS tids, {task_locks} AS task_locks
            FROM locked
            """,
            [self.batch_size],
        )[0]
        found = locked["found"]
        if not found:
            return _BatchOutcome()
        set_sql, set_params = self._set_clause(d)
        checkpoints_sql = top_sequence = ""
        checkpoint_params: list[Any] = []
        if self.create_checkpoints:
            # Each task's last sequence number is read in `c`, which is complete
            # before the first checkpoint is inserted (the window functions sort
            # all of it first): read per inserted row, a plan that scans the
            # table would also scan the rows this very INSERT adds.
            top_sequence = """,
                       COALESCE((SELECT MAX(sequence_number) FROM checkpoints AS e
                                 WHERE e.task_id = work_items.task_id), 0) AS top_sequence"""
            # The ids join by position (subscripting a text[] walks it from the start).
            checkpoints_sql = f"""
            , written AS (
                INSERT INTO checkpoints (checkpoint_id, task_id, work_item_id, checkpoint_type,
                                         sequence_number, snapshot_data, metadata, created_at)
                SELECT ids.checkpoint_id, x.task_id, x.work_item_id, 'error_boundary',
                       x.top_sequence + x.nth_of_task, x.snapshot, %s::jsonb, {d.now}
                FROM (
                    SELECT c.task_id, c.work_item_id, c.top_sequence,
                           row_number() OVER (ORDER BY c.task_id, c.work_item_id) AS position,
                           row_number() OVER (PARTITION BY c.task_id ORDER BY c.work_item_id)
                               AS nth_of_task,
                           jsonb_build_object(
                               'error', r.error_message, 'reason', 'lease_expired',
                               'old_status', 'in_progress', 'new_status', r.status,
                               'will_retry', r.status = 'pending',
                               'retry_count', r.retry_count, 'max_retries', c.max_retries,
                               'work_type', c.work_type, 'lease_holder', c.lease_holder,
                               'lease_token', c.lease_token,
                               'lease_expires_at', c.lease_expires_at,
                               'heartbeat_at', c.heartbeat_at, 'recovered_at', r.updated_at)
                               AS snapshot
                    FROM c JOIN recovered AS r ON r.work_item_id = c.work_item_id
                ) AS x
                JOIN unnest(%s::text[]) WITH ORDINALITY AS ids(checkpoint_id, position)
                    ON ids.position = x.position
                RETURNING 1
            )"""
            checkpoint_params = [
                dump_json({"source": "recovery_sweep", "sweeper": self.worker_id}),
                # ULIDs are [0-9A-Z]: an array literal needs no quoting.
                "{" + ",".join(new_ulids(found)) + "}",
            ]
        outcome = execute(
            self.using,
            f"""
            WITH c AS (
                SELECT ctid, work_item_id, task_id, work_type, lease_holder, lease_token,
                       lease_expires_at, heartbeat_at, max_retries,
                       (retry_count < max_retries
                        AND NOT work_type = ANY(%s::text[])) AS will_retry,
                       (work_type = ANY(%s::text[])) AS fail_policy{top_sequence}
                FROM work_items WHERE ctid = ANY(%s::tid[])
            ), recovered AS (
                UPDATE work_items AS w SET {set_sql}
                FROM c
                WHERE w.ctid = c.ctid AND w.lease_token = c.lease_token
                RETURNING w.work_item_id, w.status, w.retry_count, w.error_message,
                          w.queue_name, w.updated_at
            ){checkpoints_sql}
            SELECT count(*) FILTER (WHERE status = 'pending') AS requeued,
                   count(*) FILTER (WHERE status = 'failed') AS failed,
                   {"(SELECT count(*) FROM written)" if self.create_checkpoints else "0"}
                       AS checkpoints,
                   -- Re-queued items are claimable at once: wake idle workers
                   -- (delivered on commit).
                   (SELECT count(pg_notify(%s, q))
                    FROM (SELECT DISTINCT queue_name AS q FROM recovered
                          WHERE status = 'pending') AS n) AS notified
            FROM recovered
            """,
            [
                fail_types,
                fail_types,
                locked["tids"],
                *set_params,
                *checkpoint_params,
                NOTIFY_CHANNEL,
            ],
        )[0]
        return _BatchOutcome(
            found=found,
            requeued=outcome["requeued"],
            failed=outcome["failed"],
            checkpoints=outcome["checkpoints"],
        )

    def _recover_batch_sqlite(self, d: Dialect, fail_types: list[str]) -> _BatchOutcome:
        rows = self._update_batch_sqlite(d, fail_types)
        recovered = [row for row in rows if row["new_status"] is not None]
        created = 0
        if recovered and self.create_checkpoints:
            created = self._insert_checkpoints(d, recovered)
        return _BatchOutcome(
            found=len(rows),
            requeued=sum(1 for r in recovered if r["new_status"] == WorkItemStatus.PENDING),
            failed=sum(1 for r in recovered if r["new_status"] == WorkItemStatus.FAILED),
            checkpoints=created,
        )

    def _update_batch_sqlite(self, d: Dialect, fail_types: list[str]) -> list[dict[str, Any]]:
        # The IMMEDIATE transaction holds SQLite's only write lock from its first
        # statement, so nothing changes between this SELECT and the UPDATE; the
        # UPDATE re-checks anyway, as every transition here does.
        fail_in, fail_params = d.in_list("work_type", fail_types) if fail_types else ("0 = 1", [])
        candidates = execute(
            self.using,
            f"""
            SELECT work_item_id, lease_holder AS old_holder, lease_token AS old_token,
                   lease_expires_at AS old_expires_at, heartbeat_at AS old_heartbeat_at,
                   CASE WHEN retry_count < max_retries AND NOT ({fail_in}) THEN 1 ELSE 0 END
                       AS will_retry,
                   CASE WHEN {fail_in} THEN 1 ELSE 0 END AS fail_policy
            FROM work_items
            WHERE status = 'in_progress' AND lease_expires_at < {d.now}
            ORDER BY lease_expires_at
            LIMIT %s
            """,
            [*fail_params, *fail_params, self.batch_size],
        )
        if not candidates:
            return []
        set_sql, set_params = self._set_clause(d)
        values = ", ".join(["(%s, %s, %s, %s)"] * len(candidates))
        value_params: list[Any] = []
        for row in candidates:
            value_params += [
                row["work_item_id"],
                row["old_token"],
                row["will_retry"],
                row["fail_policy"],
            ]
        updated = execute(
            self.using,
            f"""
            WITH c(work_item_id, lease_token, will_retry, fail_policy) AS (VALUES {values})
            UPDATE work_items AS w SET {set_sql}
            FROM c
            WHERE w.work_item_id = c.work_item_id
              AND w.status = 'in_progress' AND w.lease_expires_at < {d.now}
              AND w.lease_token = c.lease_token
            RETURNING work_item_id, task_id, work_type, status, retry_count,
                      max_retries, error_message, updated_at
            """,
            [*value_params, *set_params],
        )
        by_id = {row["work_item_id"]: row for row in updated}
        rows = []
        for candidate in candidates:
            new = by_id.get(candidate["work_item_id"])
            rows.append(
                {
                    **candidate,
                    "task_id": new and new["task_id"],
                    "work_type": new and new["work_type"],
                    "new_status": new and new["status"],
                    "retry_count": new and new["retry_count"],
                    "max_retries": new and new["max_retries"],
                    "error_message": new and new["error_message"],
                    "updated_at": new and new["updated_at"],
                }
            )
        return rows

    def _insert_checkpoints(self, d: Dialect, rows: list[dict[str, Any]]) -> int:
        """One `error_boundary` checkpoint per recovered item, numbered race-free.

        The task locks are taken in sorted order (so concurrent sweeps cannot
        deadlock) before the INSERT, whose snapshot therefore sees every number
        committed so far; row_number() numbers several items of one task.
        """
        rows = sorted(rows, key=lambda r: (r["task_id"], r["work_item_id"]))
        lock_task_sequences(self.using, (r["task_id"] for r in rows))
        metadata = dump_json({"source": "recovery_sweep", "sweeper": self.worker_id})
        ids = new_ulids(len(rows))
        snapshots = [dump_json(_snapshot(row)) for row in rows]
        type_and_metadata = [CheckpointType.ERROR_BOUNDARY.value, metadata]
        if d.is_postgres:
            prefix = ""
            source = """
                unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::int[])
                    AS v(checkpoint_id, task_id, work_item_id, snapshot, ord)
            """
            # The SELECT list's parameters come before FROM's.
            params: list[Any] = [
                *type_and_metadata,
                ids,
                [r["task_id"] for r in rows],
                [r["work_item_id"] for r in rows],
                snapshots,
                list(range(len(rows))),
            ]
        else:
            values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(rows))
            prefix = (
                f"WITH v(checkpoint_id, task_id, work_item_id, snapshot, ord) AS (VALUES {values})"
            )
            source = "v"
            params = []
            for index, (checkpoint_id, row, snapshot) in enumerate(
                zip(ids, rows, snapshots, strict=True)
            ):
                params += [checkpoint_id, row["task_id"], row["work_item_id"], snapshot, index]
            params += type_and_metadata
        created = execute(
            self.using,
            f"""
            {prefix}
            INSERT INTO checkpoints (checkpoint_id, task_id, work_item_id, checkpoint_type,
                                     sequence_number, snapshot_data, metadata, created_at)
            SELECT v.checkpoint_id, v.task_id, v.work_item_id, %s,
                   COALESCE((SELECT MAX(sequence_number) FROM checkpoints AS existing
                             WHERE existing.task_id = v.task_id), 0)
                   + row_number() OVER (PARTITION BY v.task_id ORDER BY v.ord),
                   {"v.snapshot::jsonb" if d.is_postgres else "v.snapshot"},
                   {d.json_param()}, {d.now}
            FROM {source}
            RETURNING checkpoint_id
            """,
            params,
        )
        return len(created)

    # --- housekeeping steps -------------------------------------------------------------

    def _cleanup(self, counters: _PassCounters) -> None:
        if not self.cleanup_old_checkpoints:
            return
        since = None if self._last_cleanup_at is None else self._last_cleanup_at - CLEANUP_OVERLAP
        counters.checkpoints_deleted = cleanup_checkpoints(
            self.checkpoint_retention_limit, since=since, using=self.using
        )
        self._last_cleanup_at = counters.scanned_at

    def _expire_keys(self, counters: _PassCounters) -> None:
        counters.keys_expired = delete_expired_keys(
            using=self.using, batch_size=max(self.batch_size, 1000)
        )

    def _mark_lost(self, counters: _PassCounters) -> None:
        with translate_db_errors():
            lost = registry.mark_lost(2 * self.scan_interval_seconds, using=self.using)
        if lost:
            logger.warning("recovery sweep %s: marked lost: %s", self.worker_id, ", ".join(lost))
        counters.workers_lost = len(lost)

    # --- bookkeeping ----------------------------------------------------------------------

    def _database_failed(self, counters: _PassCounters, exc: BaseException) -> None:
        counters.errors += 1
        logger.warning("recovery sweep %s: database unavailable: %s", self.worker_id, exc)
        _close_connection(self.using)

    def _account(self, stats: RecoveryStats) -> None:
        with self._stats_lock:
            self._total_scans += 1
            for name in self._totals:
                self._totals[name] += getattr(stats, name)
            self._last_scan = stats

    def _register(self, *, running: bool) -> None:
        """Make sure this sweep's `workers` row exists (and, if running, says so).

        A running sweep checks once; one-off passes check every time (one cheap
        query), so a row deleted between scheduled passes comes back.
        """
        if running and self._registered:
            return
        with translate_db_errors():
            exists = Worker.objects.using(self.using).filter(pk=self.worker_id).exists()
            if not exists:
                try:
                    registry.register(self.worker_id, role=WorkerRole.SWEEPER, using=self.using)
                    exists = True
                except IntegrityError:
                    exists = True  # another pass with this id registered it first
            elif running:
                registry.set_status(self.worker_id, WorkerStatus.RUNNING, using=self.using)
        self._registered = exists

    def _record(self, stats: RecoveryStats) -> None:
        """Record the pass in the workers table; a failure here is logged, not raised."""
        running = self._thread is not None and self._thread.is_alive()
        try:
            self._register(running=running)
            with translate_db_errors():
                registry.record_scan(
                    self.worker_id,
                    stats.as_dict(),
                    recovered=stats.recovered,
                    failed=stats.failed,
                    using=self.using,
                )
                if not running:
                    registry.set_status(self.worker_id, WorkerStatus.STOPPED, using=self.using)
        except DatabaseUnavailable as exc:
            logger.warning("recovery sweep %s: could not record the pass: %s", self.worker_id, exc)
            _close_connection(self.using)
        except DatabaseError:
            logger.exception("recovery sweep %s: could not record the pass", self.worker_id)

    def _stopping(self) -> bool:
        """True while the background thread is winding down: end the pass early.

        Each batch commits on its own, so stopping between batches loses nothing.
        """
        thread = self._thread
        return self._stop_event.is_set() and thread is not None and thread.is_alive()

    def _log(self, stats: RecoveryStats) -> None:
        if stats.errors:
            logger.warning("recovery sweep %s: %s", self.worker_id, describe(stats))
        elif stats.expired_found or stats.workers_lost:
            logger.info("recovery sweep %s: %s", self.worker_id, describe(stats))
        else:
            logger.debug("recovery sweep %s: %s", self.worker_id, describe(stats))

    # --- background thread ---------------------------------------------------------------

    def start(self) -> None:
        """Run a pass now and then every `scan_interval_seconds` in a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            state = "stopping" if self._stop_event.is_set() else "running"
            raise RuntimeError(f"recovery sweep {self.worker_id} is still {state}")
        self._stop_event.clear()
        self._registered = False
        self._thread = threading.Thread(
            target=self._loop, name=f"leasing-sweep-{self.worker_id}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop_event.is_set():
                try:
                    self._register(running=True)
                except DatabaseUnavailable as exc:
                    logger.warning("recovery sweep %s: cannot register: %s", self.worker_id, exc)
                    _close_connection(self.using)
                except DatabaseError:
                    logger.exception("recovery sweep %s: cannot register", self.worker_id)
                try:
                    self.scan_and_recover()
                except Exception:  # pragma: no cover - scan_and_recover() catches its own
                    logger.exception("recovery sweep %s: pass crashed", self.worker_id)
                    _close_connection(self.using)
                self._stop_event.wait(self.scan_interval_seconds)
        finally:
            try:
                with translate_db_errors():
                    registry.set_status(self.worker_id, WorkerStatus.STOPPED, using=self.using)
            except Exception:
                logger.exception("recovery sweep %s: could not mark itself stopped", self.worker_id)
            connections[self.using].close()

    def stop(self, wait: bool = True, timeout: float = 10.0) -> bool:
        """Ask the thread to stop after its current batch; True once it has ended.

        The thread marks the sweep's row `stopped` and closes its connection on
        the way out, whether or not this call waits for it.
        """
        timeout = validation.positive_seconds("timeout", timeout)
        self._stop_event.set()
        thread = self._thread
        if thread is None:
            return True
        if wait and thread is not threading.current_thread():
            thread.join(timeout)
        return not thread.is_alive()

    def is_running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive() and not self._stop_event.is_set()

    def get_statistics(self) -> dict[str, Any]:
        """Counters since this object was created, and the last pass's stats."""
        with self._stats_lock:
            last = self._last_scan
            totals = dict(self._totals)
            scans = self._total_scans
        return {
            "worker_id": self.worker_id,
            "is_running": self.is_running(),
            "scan_interval_seconds": self.scan_interval_seconds,
            "total_scans": scans,
            "total_expired_found": totals["expired_found"],
            "total_recovered": totals["recovered"],
            "total_failed": totals["failed"],
            "total_errors": totals["errors"],
            "total_checkpoints_created": totals["checkpoints_created"],
            "total_checkpoints_deleted": totals["checkpoints_deleted"],
            "total_keys_expired": totals["keys_expired"],
            "total_workers_lost": totals["workers_lost"],
            "last_scan": None if last is None else last.as_dict(),
            "last_scan_at": None if last is None else last.scanned_at,
        }


# --- helpers ----------------------------------------------------------------------------


def _fail_on_expiry_types() -> list[str]:
    from .handlers import registry as handler_registry

    return handler_registry.fail_on_expiry_types()


def _iso(value: Any) -> str | None:
    dt = to_datetime(value)
    return None if dt is None else dt.isoformat()


def _snapshot(row: dict[str, Any]) -> dict[str, Any]:
    """The `error_boundary` snapshot of one recovered item."""
    return {
        "error": row["error_message"],
        "reason": "lease_expired",
        "old_status": WorkItemStatus.IN_PROGRESS.value,
        "new_status": row["new_status"],
        "will_retry": row["new_status"] == WorkItemStatus.PENDING,
        "retry_count": row["retry_count"],
        "max_retries": row["max_retries"],
        "work_type": row["work_type"],
        "lease_holder": row["old_holder"],
        "lease_token": row["old_token"],
        "lease_expires_at": _iso(row["old_expires_at"]),
        "heartbeat_at": _iso(row["old_heartbeat_at"]),
        "recovered_at": _iso(row["updated_at"]),
    }


def _close_connection(using: str) -> None:
    """Drop a connection that may be broken, so the next query reconnects."""
    connection = connections[using]
    if connection.in_atomic_block:
        return  # the owner of the transaction decides; closing would hide its error
    try:
        connection.close()
    except Exception:  # pragma: no cover - closing a dead connection can itself fail
        logger.debug("closing the broken connection failed", exc_info=True)


def describe(stats: RecoveryStats) -> str:
    """One human-readable line for a pass."""
    return (
        f"{stats.expired_found} expired: {stats.recovered} re-queued, {stats.failed} failed; "
        f"{stats.checkpoints_created} checkpoints written, {stats.checkpoints_deleted} pruned; "
        f"{stats.keys_expired} idempotency keys expired; {stats.workers_lost} workers lost; "
        f"{stats.errors} errors; {stats.scan_duration_ms:.0f} ms"
    )


# --- django-q2 ----------------------------------------------------------------------------

_scheduled_sweeps: dict[tuple[Any, ...], RecoverySweep] = {}
_scheduled_lock = threading.Lock()


def run_sweep_pass(
    interval: float | None = None,
    retention: int | None = None,
    create_checkpoints: bool = True,
    cleanup_old_checkpoints: bool = True,
    using: str = "default",
    worker_id: str = SCHEDULED_SWEEPER_ID,
) -> dict[str, Any]:
    """Run one sweep pass and return its stats as a JSON-able dict.

    Meant as a django-q2 scheduled task (see `schedule_sweep()`), or for any
    scheduler that calls a function. `interval` is how often the caller runs
    it: processes not seen for twice that long are marked lost. Passes share
    one `workers` row (`worker_id`), left `stopped` between passes; the sweep
    object is reused within a process so retention stays incremental.
    """
    key = (interval, retention, create_checkpoints, cleanup_old_checkpoints, using, worker_id)
    with _scheduled_lock:
        sweep = _scheduled_sweeps.get(key)
        if sweep is None:
            sweep = _scheduled_sweeps[key] = RecoverySweep(
                scan_interval_seconds=interval,
                create_checkpoints=create_checkpoints,
                cleanup_old_checkpoints=cleanup_old_checkpoints,
                checkpoint_retention_limit=retention,
                using=using,
                worker_id=worker_id,
            )
    stats = sweep.scan_and_recover()
    return {"worker_id": sweep.worker_id, **stats.as_dict()}


def schedule_minutes(interval_seconds: float) -> int:
    """django-q2 schedules run every whole minute at best: round the interval up."""
    interval_seconds = validation.positive_seconds("interval", interval_seconds)
    return max(1, math.ceil(interval_seconds / 60))


def schedule_sweep(
    interval_seconds: float | None = None,
    retention: int | None = None,
    create_checkpoints: bool = True,
    cleanup_old_checkpoints: bool = True,
    using: str = "default",
) -> tuple[Any, bool]:
    """Create or update the django-q2 `Schedule` that runs `run_sweep_pass()`.

    Idempotent: the schedule is found by its fixed name (`SCHEDULE_NAME`), so
    running this twice leaves one schedule (duplicates made by hand are
    removed). The interval is rounded up to whole minutes, the finest grain
    of django-q2's MINUTES schedules; the task is told the effective interval
    so "lost" still means two missed passes. Returns `(schedule, created)`.
    """
    from django_q.models import Schedule

    conf = get_settings()
    minutes = schedule_minutes(
        conf.sweep_interval if interval_seconds is None else interval_seconds
    )
    retention = validation.integer(
        "retention", conf.checkpoint_retention if retention is None else retention, minimum=1
    )
    for name, flag in (
        ("create_checkpoints", create_checkpoints),
        ("cleanup_old_checkpoints", cleanup_old_checkpoints),
    ):
        if not isinstance(flag, bool):
            raise InvalidInput(f"{name} must be True or False, got {flag!r}.")
    kwargs: dict[str, Any] = {
        "interval": float(minutes * 60),
        "retention": retention,
        "create_checkpoints": create_checkpoints,
        "cleanup_old_checkpoints": cleanup_old_checkpoints,
    }
    if using != "default":
        kwargs["using"] = using
    fields = {
        "func": f"{__name__}.run_sweep_pass",
        "args": None,
        "kwargs": repr(kwargs),
        "schedule_type": Schedule.MINUTES,
        "minutes": minutes,
        "repeats": -1,
    }
    with transaction.atomic(using=using):
        existing = list(
            Schedule.objects.using(using)
            .select_for_update()
            .filter(name=SCHEDULE_NAME)
            .order_by("pk")
        )
        if existing:
            schedule = existing[0]
            for name, value in fields.items():
                setattr(schedule, name, value)
            schedule.full_clean()
            schedule.save(using=using)
            for duplicate in existing[1:]:
                duplicate.delete(using=using)
            return schedule, False
        schedule = Schedule(name=SCHEDULE_NAME, **fields)
        schedule.full_clean()
        schedule.save(using=using)
        return schedule, True


__all__ = [
    "FAIL_POLICY_MESSAGE",
    "MAX_RETRIES_MESSAGE",
    "RETRY_MESSAGE",
    "SCHEDULED_SWEEPER_ID",
    "SCHEDULE_NAME",
    "RecoveryStats",
    "RecoverySweep",
    "describe",
    "run_sweep_pass",
    "schedule_minutes",
    "schedule_sweep",
]
