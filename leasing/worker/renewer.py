"""One thread per worker process renewing the leases it may keep alive.

It ticks at the shortest heartbeat interval of the work types the process
serves. Each tick it renews, in one statement, the renewable slots whose own
type's interval is about to run out since their claim or last renewal (a
lease with more than half its duration left only records the heartbeat: a
HOT-eligible update), records the handlers' progress as `progress_at`, and
beats the process's `workers` row. A quick item of a type beating every 30 s
in a process that also serves a 3 s type is thus written by its claim and its
completion only, not every 3 s while it waits in the prefetch queue.

Leases the database no longer shows as held (expired, past their deadline,
moved on) are reported through `on_lease_lost`; after `max_failures`
consecutive failed rounds every lease is reported lost, as the process can no
longer prove it is alive.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from django.db import DatabaseError

from ..exceptions import DatabaseUnavailable, LeaseExpiredError
from ..services.leases import LeaseManager
from ..sql.renewals import Renewal
from ..sql.runner import close_connection
from ..threads import IntervalThread
from .slots import Slot, SlotState, SlotTable

logger = logging.getLogger("leasing.worker")


class LeaseRenewer(IntervalThread):
    """Renews the renewable slots of a `SlotTable` every `interval_seconds`."""

    def __init__(
        self,
        manager: LeaseManager,
        slots: SlotTable,
        *,
        interval_seconds: float,
        on_lease_lost: Callable[[Slot, BaseException], None],
        on_tick: Callable[[], None] | None = None,
        max_failures: int = 3,
        heartbeat_intervals: Mapping[str, float] | None = None,
    ) -> None:
        self.manager = manager
        # Each work type's own heartbeat interval; a type not named is renewed every tick.
        self.heartbeat_intervals = heartbeat_intervals or {}
        self.slots = slots
        self.on_lease_lost = on_lease_lost
        self.on_tick = on_tick
        self.max_failures = max_failures
        self.consecutive_failures = 0
        self.rounds = 0
        super().__init__(name="lease-renewer", interval=interval_seconds, using=manager.using)

    def tick(self) -> None:
        self.renew_now()

    def tracked(self) -> list[Slot]:
        """The slots this renewer keeps alive: running beat-mode ones extend themselves."""
        return [
            slot
            for slot in self.slots.renewable()
            if not (slot.state is SlotState.RUNNING and slot.spec.heartbeat == "beat")
        ]

    def due(self, slot: Slot, now: float) -> bool:
        """Whether waiting for the next tick would leave the slot unrenewed past its period.

        The period is its type's heartbeat interval, and at most a quarter of
        its lease: a renewal that only records the heartbeat leaves at least
        half the lease, so the next one comes with a quarter of it to spare.
        """
        interval = self.heartbeat_intervals.get(slot.lease.work_type, self.interval)
        period = min(interval, slot.lease_duration / 4)
        return now - slot.renewed_at >= period - self.interval

    def renew_now(self) -> None:
        """One renewal round (also called directly by tests)."""
        now = time.monotonic()
        tracked = [slot for slot in self.tracked() if self.due(slot, now)]
        renewals = [
            Renewal(
                slot.lease.work_item_id,
                slot.lease.token,
                slot.lease_duration,
                slot.lease_duration / 2,
                slot.heartbeat.elapsed() if slot.heartbeat.beats else None,
            )
            for slot in tracked
        ]
        started = time.monotonic()
        try:
            renewed, lost = self.manager.renew(renewals) if renewals else (set(), set())
            if self.on_tick is not None:
                self.on_tick()
        except (DatabaseUnavailable, DatabaseError) as exc:
            self.consecutive_failures += 1
            logger.warning(
                "lease renewal round failed (%d/%d): %s",
                self.consecutive_failures,
                self.max_failures,
                exc,
            )
            close_connection(self.manager.using)
            if self.consecutive_failures >= self.max_failures:
                for slot in tracked:
                    self.on_lease_lost(slot, exc)
            return
        self.consecutive_failures = 0
        self.rounds += 1
        for slot in tracked:
            if slot.key in renewed:
                slot.renewed_at = started
            elif slot.key in lost:
                self.on_lease_lost(
                    slot,
                    LeaseExpiredError(
                        f"lease on {slot.lease.work_item_id} (token {slot.lease.token}) "
                        "expired, reached its deadline or moved on"
                    ),
                )
            else:  # its row was held by another transaction: neither renewed nor lost
                self._skipped(slot, started)

    def _skipped(self, slot: Slot, started: float) -> None:
        """A lease whose row another transaction held: say so once it is at risk.

        A completion being written holds it for milliseconds; a handler that
        keeps a transaction open around its own checkpoint holds it until that
        transaction ends, and the lease runs out meanwhile.
        """
        unrenewed = started - slot.renewed_at
        if unrenewed > slot.lease_duration / 2:
            logger.warning(
                "lease on %s (token %d) not renewed for %.0f s: another transaction holds "
                "its row (a handler's transaction open around a checkpoint?); it runs out "
                "if that goes on",
                slot.lease.work_item_id,
                slot.lease.token,
                unrenewed,
            )
