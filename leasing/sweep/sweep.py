"""The recovery sweep, or watchdog: expired leases back to work.

A worker that dies or hangs stops renewing its lease. Each pass of the sweep
recovers every `in_progress` item whose lease ran out (by the database
clock), batch by batch (`leasing.services.recovery`), then enforces
checkpoint retention, deletes expired idempotency keys, marks processes
that went silent `lost` and rolls finished items up for the console
(`leasing.services.rollups`).

A running sweep registers in the `workers` table (role `sweeper`) and
records every pass there, which is how the console knows when the watchdog
last ran. A one-off pass (`scan_and_recover()` without `start()`,
`recoverysweep --once`, a scheduled task) records itself too, but leaves its
row `stopped`: a record of a pass, not a live process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from django.db import DatabaseError, connections

from .. import validation
from ..conf import get_settings
from ..exceptions import DatabaseUnavailable, InvalidInput, ProcessIdInUse, one_line
from ..services import processes
from ..services.checkpoints import cleanup_checkpoints_since_mark
from ..services.idempotency import delete_expired_keys
from ..services.recovery import BatchOutcome, expired_ids, recover_batch
from ..services.rollups import roll_up_finished_hours
from ..sql import unique
from ..sql.runner import close_connection, database_now, is_lock_conflict, translate_db_errors
from ..states import WorkerRole, WorkerStatus
from .stats import COUNTED, RecoveryStats, describe

# The key of a recorded pass's stats that says it ran on its own (`scan_and_recover()`
# without `start()`), so its row is left stopped between passes.
ONE_OFF = "one_off"

logger = logging.getLogger("leasing.sweep")

# SQLite binds at most 32766 parameters; a checkpoint row binds five.
MAX_BATCH_SIZE = 5000
# A batch aborted by a lock conflict (busy workers' SKIP LOCKED claims can take
# part in a deadlock) is run again at once, this many times in a row at most.
MAX_CONFLICT_RETRIES = 3
# A pass lists at most this many ids of rows it could not recover.
MAX_UNRECOVERED_SHOWN = 20


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be True or False, got {value!r}.")
    return value


class RecoverySweep:
    """Finds expired leases and recovers them; optionally in a background thread.

    `scan_and_recover()` runs one pass in the calling thread. `start()` runs a
    pass every `scan_interval_seconds` in a daemon thread (with its own
    database connection) until `stop()`. Database outages are counted as
    errors and survived: the next pass reconnects.
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
        self.create_checkpoints = _flag("create_checkpoints", create_checkpoints)
        self.cleanup_old_checkpoints = _flag("cleanup_old_checkpoints", cleanup_old_checkpoints)
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
        self.using = validation.database_alias(using)
        self.worker_id = (
            processes.new_process_id(WorkerRole.SWEEPER)
            if worker_id is None
            else validation.non_empty_text("worker_id", worker_id)
        )
        if on_scan is not None and not callable(on_scan):
            raise InvalidInput(f"on_scan must be callable, got {on_scan!r}.")
        self.on_scan = on_scan
        # Processes that recorded no interval of their own are judged by their role's
        # configured one, as the console judges them (`console.liveness.beat_interval`).
        self.default_process_interval = conf.heartbeat_interval
        self.default_sweeper_interval = conf.sweep_interval

        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._scan_lock = threading.Lock()  # one pass at a time per sweep
        self._stats_lock = threading.Lock()
        self._registered = False
        self._total_scans = 0
        self._totals = dict.fromkeys(COUNTED, 0)
        self._last_scan: RecoveryStats | None = None

    def __repr__(self) -> str:
        return (
            f"<RecoverySweep worker_id={self.worker_id!r} "
            f"interval={self.scan_interval_seconds:g}s running={self.is_running()}>"
        )

    # --- one pass ------------------------------------------------------------------------

    def scan_and_recover(self) -> RecoveryStats:
        """Run one pass: recover expired leases, then retention, keys and lost processes."""
        with self._scan_lock:
            started = time.monotonic()
            counts: dict[str, Any] = dict.fromkeys(COUNTED, 0)
            counts["scanned_at"] = None
            counts["unrecovered"] = ()
            outage = False
            steps = (
                self._recover_expired,
                self._cleanup,
                self._expire_keys,
                self._mark_lost,
                self._roll_up,
            )
            for step in steps:
                if outage or self._stopping():
                    break
                try:
                    step(counts)
                except DatabaseUnavailable as exc:
                    outage = True
                    counts["errors"] += 1
                    logger.warning(
                        "recovery sweep %s: database unavailable: %s", self.worker_id, exc
                    )
                    close_connection(self.using)
                except Exception:  # e.g. LEASING["HANDLERS"] names a module that fails to import
                    counts["errors"] += 1
                    logger.exception("recovery sweep %s: %s failed", self.worker_id, step.__name__)
            stats = RecoveryStats(
                scan_duration_ms=round((time.monotonic() - started) * 1000, 1), **counts
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

    def _recover_expired(self, counts: dict[str, Any]) -> None:
        """Recover batch by batch until a batch comes back short.

        A batch aborted by a lock conflict, or by a unique key a concurrent
        enqueue took meanwhile, is rolled back and run again (up to
        MAX_CONFLICT_RETRIES times in a row). A batch that fails for another
        reason is rolled back and its rows are recovered one by one: a row
        that fails on its own is left as it was, logged by id, counted and
        listed in the pass's `unrecovered` (the console shows it), and the
        rest of the pass goes on without it; the next pass tries it again.
        """
        counts["scanned_at"] = database_now(self.using)
        skipped: list[str] = []
        conflicts = 0
        while not self._stopping():
            try:
                outcome = self._recover(exclude=skipped)
            except DatabaseUnavailable:
                raise
            except Exception as exc:
                if self._conflict(exc, conflicts):
                    conflicts += 1
                    continue
                logger.warning(
                    "recovery sweep %s: a batch failed (%s); recovering its rows one by one",
                    self.worker_id,
                    one_line(exc),
                )
                outcome = self._isolate(counts, skipped)
            conflicts = 0
            counts["batches"] += 1
            counts["expired_found"] += outcome.found
            counts["recovered"] += outcome.requeued
            counts["failed"] += outcome.failed
            counts["cancelled"] += outcome.cancelled
            counts["checkpoints_created"] += outcome.checkpoints
            if outcome.found < self.batch_size:
                break
        counts["unrecovered"] = tuple(skipped[:MAX_UNRECOVERED_SHOWN])

    def _recover(self, *, exclude: Collection[str] = (), only: str | None = None) -> BatchOutcome:
        return recover_batch(
            self.using,
            self.batch_size,
            create_checkpoints=self.create_checkpoints,
            sweeper_id=self.worker_id,
            exclude=exclude,
            only=only,
        )

    def _conflict(self, exc: Exception, conflicts: int) -> bool:
        """A lock conflict or a unique-key race: worth running the same statement again."""
        if not (is_lock_conflict(exc) or unique.raced(exc)) or conflicts >= MAX_CONFLICT_RETRIES:
            return False
        logger.warning(
            "recovery sweep %s: a batch was aborted (%s); running it again",
            self.worker_id,
            (str(exc).strip().splitlines() or [type(exc).__name__])[0],
        )
        return True

    def _isolate(self, counts: dict[str, Any], skipped: list[str]) -> BatchOutcome:
        """Recover the next batch's rows one at a time, skipping (and listing) those that fail."""
        ids = expired_ids(self.using, self.batch_size, exclude=skipped)
        found = requeued = failed = cancelled = checkpoints = 0
        for item_id in ids:
            conflicts = 0
            while True:
                try:
                    outcome = self._recover(only=item_id)
                except DatabaseUnavailable:
                    raise
                except Exception as exc:
                    if self._conflict(exc, conflicts):
                        conflicts += 1
                        continue
                    skipped.append(item_id)
                    counts["errors"] += 1
                    logger.error(
                        "recovery sweep %s: could not recover %s; it stays in progress until "
                        "the next pass: %s",
                        self.worker_id,
                        item_id,
                        one_line(exc),
                    )
                    break
                found += 1
                requeued += outcome.requeued
                failed += outcome.failed
                cancelled += outcome.cancelled
                checkpoints += outcome.checkpoints
                break
        # Rows that failed count as found (the batch ends when fewer than a batch remain).
        return BatchOutcome(
            found=len(ids),
            requeued=requeued,
            failed=failed,
            cancelled=cancelled,
            checkpoints=checkpoints,
        )

    def _cleanup(self, counts: dict[str, Any]) -> None:
        if not self.cleanup_old_checkpoints:
            return
        at = counts["scanned_at"] or database_now(self.using)
        counts["checkpoints_deleted"] = cleanup_checkpoints_since_mark(
            self.checkpoint_retention_limit, at=at, using=self.using
        ).deleted

    def _expire_keys(self, counts: dict[str, Any]) -> None:
        counts["keys_expired"] = delete_expired_keys(
            using=self.using, batch_size=max(self.batch_size, 1000)
        )

    def _mark_lost(self, counts: dict[str, Any]) -> None:
        with translate_db_errors():
            lost = processes.mark_lost(
                self.default_process_interval,
                sweeper_interval=self.default_sweeper_interval,
                using=self.using,
            )
        if lost:
            logger.warning("recovery sweep %s: marked lost: %s", self.worker_id, ", ".join(lost))
        counts["workers_lost"] = len(lost)

    def _roll_up(self, counts: dict[str, Any]) -> None:
        """Fold what finished up to the last quarter hour into the console's hourly rollup."""
        with translate_db_errors():
            counts["hours_rolled_up"] = roll_up_finished_hours(using=self.using).hours

    # --- bookkeeping ----------------------------------------------------------------------

    def _account(self, stats: RecoveryStats) -> None:
        with self._stats_lock:
            self._total_scans += 1
            for name in self._totals:
                self._totals[name] += getattr(stats, name)
            self._last_scan = stats

    def _record(self, stats: RecoveryStats) -> None:
        """Record the pass in the workers table; a failure here is logged, not raised."""
        running = self._thread is not None and self._thread.is_alive()
        try:
            with translate_db_errors():
                if not (running and self._registered):
                    self._register()
                recorded = processes.record_scan(
                    self.worker_id,
                    # A pass without a sweep process behind it (cron, django-q2, your own
                    # scheduler): the console judges its row by the time since the pass.
                    {**stats.as_dict(), ONE_OFF: not running},
                    recovered=stats.recovered,
                    failed=stats.failed,
                    using=self.using,
                )
                if not recorded:  # the row was deleted: bring it back next time
                    self._registered = False
                if not running:
                    processes.set_status(self.worker_id, WorkerStatus.STOPPED, using=self.using)
        except DatabaseUnavailable as exc:
            logger.warning("recovery sweep %s: could not record the pass: %s", self.worker_id, exc)
            close_connection(self.using)
        except (DatabaseError, ProcessIdInUse) as exc:
            logger.error("recovery sweep %s: could not record the pass: %s", self.worker_id, exc)

    def _register(self) -> None:
        processes.register(
            self.worker_id,
            WorkerRole.SWEEPER,
            heartbeat_interval=self.scan_interval_seconds,
            using=self.using,
        )
        self._registered = True

    def _stopping(self) -> bool:
        """True while the background thread is winding down: end the pass early.

        Each batch commits on its own, so stopping between batches loses nothing.
        """
        thread = self._thread
        return self._stop_event.is_set() and thread is not None and thread.is_alive()

    def _log(self, stats: RecoveryStats) -> None:
        if stats.errors:
            logger.warning("recovery sweep %s: %s", self.worker_id, describe(stats))
        else:
            logger.info("recovery sweep %s: %s", self.worker_id, describe(stats))

    # --- background thread ---------------------------------------------------------------

    def start(self) -> None:
        """Register, then run a pass now and every `scan_interval_seconds` in a daemon thread.

        Raises `ProcessIdInUse` if a live sweep already uses this id.
        """
        if self._thread is not None and self._thread.is_alive():
            state = "stopping" if self._stop_event.is_set() else "running"
            raise RuntimeError(f"recovery sweep {self.worker_id} is still {state}")
        with translate_db_errors():
            self._register()
        self._stop_event.clear()
        self._thread = threading.Thread(
            target=self._loop, name=f"leasing-sweep-{self.worker_id}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop_event.is_set():
                try:
                    self.scan_and_recover()
                except Exception:  # pragma: no cover - scan_and_recover() catches its own
                    logger.exception("recovery sweep %s: pass crashed", self.worker_id)
                    close_connection(self.using)
                self._stop_event.wait(self.scan_interval_seconds)
        finally:
            try:
                with translate_db_errors():
                    processes.set_status(self.worker_id, WorkerStatus.STOPPED, using=self.using)
            except Exception:
                logger.exception("recovery sweep %s: could not mark itself stopped", self.worker_id)
            connections[self.using].close()

    def stop(self, wait: bool = True, timeout: float = 10.0) -> bool:
        """Ask the thread to stop after its current batch; True once it has ended."""
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
            **{f"total_{name}": value for name, value in totals.items() if name != "batches"},
            "last_scan": None if last is None else last.as_dict(),
            "last_scan_at": None if last is None else last.scanned_at,
        }
