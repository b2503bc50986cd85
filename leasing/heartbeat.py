"""Heartbeats: keeping leases alive while work runs.

Two policies of one mechanism (`leasing.keeping.LeaseKeeper`):

* `HeartbeatThread` renews one lease on a timer, whatever the handler does
  (the `thread` mode). It works for any code, including code that never
  reports progress; a worker whose process dies stops renewing, which is what
  the sweep needs.
* `Heartbeat` + `LeaseExtender` renew only on proof of work (the `beat` mode):
  the handler calls `beat()` as it makes progress and the extender extends the
  lease at most once per interval. A handler that is stuck stops beating and
  its lease runs out, so a stuck run is recovered and a slow but working one
  is not.

The worker runtime keeps every lease of its process with one keeper on one
thread (`leasing.worker.renewer`), each lease by its type's mode, in one
statement per round, instead of a thread and a connection per item.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from . import validation
from .conf import get_settings
from .exceptions import InvalidInput
from .keeping import WORK, KeptLease, LeaseKeeper
from .services.held import Lease
from .services.leases import LeaseManager
from .threads import IntervalThread

logger = logging.getLogger(__name__)

LeaseLostCallback = Callable[[str, BaseException], None]


class HeartbeatThread(IntervalThread):
    """Renew one lease every `interval_seconds` on a daemon thread (the `thread` mode).

    The thread uses its own database connection and closes it when it ends.
    On `LeaseExpiredError` / `LeaseConflictError`, or after `max_failures`
    consecutive transient errors, it stops and calls
    `on_lease_lost(work_item_id, error)`. The lease is the manager's newest
    held lease on the item.
    """

    def __init__(
        self,
        lease_manager: LeaseManager,
        work_item_id: str,
        interval_seconds: float = 30.0,
        lease_duration_seconds: float = 300.0,
        max_failures: int = 3,
        on_lease_lost: LeaseLostCallback | None = None,
        *,
        progress: Heartbeat | None = None,
    ) -> None:
        self.interval = validation.positive_seconds("interval_seconds", interval_seconds)
        self.lease_duration = validation.positive_seconds(
            "lease_duration_seconds", lease_duration_seconds
        )
        validation.heartbeat_below_lease(self.interval, self.lease_duration)
        self.max_failures = validation.integer("max_failures", max_failures, minimum=1)
        self.lease_manager = lease_manager
        self.work_item_id = validation.non_empty_text("work_item_id", work_item_id)
        self.on_lease_lost = on_lease_lost
        self.progress = progress
        self.renewals = 0
        self.lost_error: BaseException | None = None
        # A renewal every tick, always to now + lease_duration.
        self._keeper = LeaseKeeper(lease_manager, on_lost=self._lost, max_failures=max_failures)
        super().__init__(
            name=f"heartbeat-{self.work_item_id}", interval=self.interval, using=lease_manager.using
        )

    @property
    def consecutive_failures(self) -> int:
        return self._keeper.consecutive_failures

    def tick(self) -> bool:
        """Renew; True when the thread must stop because the lease is lost."""
        lease = self.lease_manager.lease_for(self.work_item_id)
        if lease is None:  # not (or no longer) held by this manager
            self._lose(self.lease_manager.refusal(self.work_item_id, None, renewing=True))
            return True
        kept = KeptLease(lease.key, self.lease_duration, period=0.0, progress=self.progress)
        renewed, _due = self._keeper.keep([kept])
        self.renewals += len(renewed)
        return self.lost_error is not None

    def _lost(self, kept: KeptLease, error: BaseException) -> None:
        self._lose(error)

    def _lose(self, error: BaseException) -> None:
        self.lost_error = error
        logger.warning("lease on %s lost: %s", self.work_item_id, error)
        if self.on_lease_lost is not None:
            try:
                self.on_lease_lost(self.work_item_id, error)
            except Exception:  # a broken callback must not kill the heartbeat silently
                logger.exception("on_lease_lost callback failed for %s", self.work_item_id)


def start_heartbeat(
    lease_manager: LeaseManager,
    work_item_id: str,
    interval_seconds: float | None = None,
    lease_duration_seconds: float | None = None,
    max_failures: int | None = None,
    on_lease_lost: LeaseLostCallback | None = None,
) -> HeartbeatThread:
    """Create and start a `HeartbeatThread` with the `LEASING` defaults."""
    conf = get_settings()
    return HeartbeatThread(
        lease_manager,
        work_item_id,
        interval_seconds=conf.heartbeat_interval if interval_seconds is None else interval_seconds,
        lease_duration_seconds=(
            conf.lease_duration if lease_duration_seconds is None else lease_duration_seconds
        ),
        max_failures=conf.heartbeat_max_failures if max_failures is None else max_failures,
        on_lease_lost=on_lease_lost,
    ).start()


class Heartbeat:
    """Proof of progress: a handler calls `beat()` whenever it gets something done.

    Thread-safe; times come from the monotonic clock, so wall-clock jumps do not
    fake progress. `on_beat` is called after each beat, outside the lock, so a
    slow callback (a lease extension) never blocks other beats' bookkeeping.
    """

    __slots__ = ("_beats", "_last", "on_beat")

    # One lock for every heartbeat: a worker makes one per claimed item, and
    # allocating a lock each time cost more than a no-op handler; a beat holds
    # it for two assignments.
    _lock = threading.Lock()

    def __init__(self, on_beat: Callable[[], None] | None = None) -> None:
        self._last = time.monotonic()
        self._beats = 0
        self.on_beat = on_beat

    def beat(self) -> None:
        with self._lock:
            self._last = time.monotonic()
            self._beats += 1
            callback = self.on_beat
        if callback is not None:
            callback()

    def elapsed(self) -> float:
        """Seconds since the last beat (or since creation, before the first)."""
        with self._lock:
            return time.monotonic() - self._last

    @property
    def beats(self) -> int:
        with self._lock:
            return self._beats


@dataclass(frozen=True, slots=True)
class LeaseExtenderConfig:
    """Proof-of-work extension: at most one extension per `interval` seconds."""

    interval: float = 60.0
    extension: float = 300.0
    enabled: bool = True

    def __post_init__(self) -> None:
        validation.positive_seconds("interval", self.interval)
        validation.positive_seconds("extension", self.extension)
        if self.interval >= self.extension:
            raise InvalidInput(
                f"interval ({self.interval:g}s) must be below extension ({self.extension:g}s), "
                "or a beating handler's lease runs out between two extensions."
            )
        if not isinstance(self.enabled, bool):
            raise InvalidInput(f"enabled must be True or False, got {self.enabled!r}.")

    @classmethod
    def from_settings(cls) -> LeaseExtenderConfig:
        conf = get_settings()
        return cls(
            interval=conf.extender_interval,
            extension=conf.extender_extension,
            enabled=conf.extender_enabled,
        )


class LeaseExtender:
    """Extends a lease when its handler beats, at most once per interval (the `beat` mode).

        extender = LeaseExtender(LeaseExtenderConfig(interval=60, extension=300))
        with extender.attach(lease, heartbeat):
            run_handler()

    The extension runs in the beating thread (with its connection). A lost
    lease is logged and reported through `on_lease_lost`, never raised into
    the handler's `beat()`; a failed extension is tried again at the next
    beat after the interval.
    """

    def __init__(
        self,
        config: LeaseExtenderConfig | None = None,
        *,
        using: str = "default",
        on_lease_lost: LeaseLostCallback | None = None,
    ) -> None:
        self.config = config or LeaseExtenderConfig.from_settings()
        self.using = using
        self.on_lease_lost = on_lease_lost
        self.extensions = 0
        self.lost_error: BaseException | None = None
        # One extension at a time: a beat while another thread extends skips it.
        self._extending = threading.Lock()

    @contextlib.contextmanager
    def attach(self, lease: Lease, heartbeat: Heartbeat) -> Iterator[LeaseExtender]:
        manager = LeaseManager(lease.worker_id, using=self.using)
        keeper = LeaseKeeper(manager, on_lost=self._lost, max_failures=None)
        # The claim itself is the first "extension": the interval runs from now.
        kept = KeptLease(
            lease.key,
            self.config.extension,
            period=self.config.interval,
            policy=WORK,
            progress=heartbeat,
            beats_seen=heartbeat.beats,
        )
        previous = heartbeat.on_beat

        def on_beat() -> None:
            if previous is not None:
                previous()
            if not self.config.enabled or self.lost_error is not None:
                return
            if self._extending.acquire(blocking=False):
                try:
                    renewed, _due = keeper.keep([kept])
                    self.extensions += len(renewed)
                finally:
                    self._extending.release()

        heartbeat.on_beat = on_beat
        try:
            yield self
        finally:
            heartbeat.on_beat = previous

    def _lost(self, kept: KeptLease, error: BaseException) -> None:
        self.lost_error = error
        logger.warning("lease on %s lost during extension: %s", kept.work_item_id, error)
        if self.on_lease_lost is not None:
            self.on_lease_lost(kept.work_item_id, error)
