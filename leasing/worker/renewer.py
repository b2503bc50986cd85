"""One thread per worker process keeping the leases of its runs alive.

It ticks at the shortest heartbeat interval of the work types the process
serves, and each tick one `LeaseKeeper` round (`leasing.keeping`) renews, in
one statement, the runs whose lease is due by its policy:

* a run of a `thread`-mode type, or any run still waiting for an executor:
  its type's heartbeat interval (at most a quarter of its lease) has passed
  since its claim or last renewal; a lease with more than half its duration
  left only records the heartbeat (a HOT-eligible update), so a quick item of
  a type beating every 30 s in a process that also serves a 3 s type is
  written by its claim and its completion only;
* a running `beat`-mode run (proof of work): its handler beat since the last
  renewal, and that interval (capped by `EXTENDER_INTERVAL`) has passed; a
  handler that stops beating lets its lease run out; from a round after its
  expiry the renewer reads what became of it, and the run is abandoned once
  the item moved on (the sweep recovered it).

Each round also beats the process's `workers` row. Leases the database no
longer shows as held are reported through `on_lease_lost`; after
`max_failures` consecutive failed rounds every due lease is reported lost, as
the process can no longer prove it is alive.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping

from django.db import DatabaseError

from ..exceptions import DatabaseUnavailable
from ..keeping import TIME, WORK, KeptLease, LeaseKeeper
from ..services.leases import LeaseManager
from ..threads import IntervalThread
from .slots import Slot, SlotState, SlotTable

logger = logging.getLogger("leasing.worker")


class LeaseRenewer(IntervalThread):
    """Keeps the leases of a `SlotTable`'s runs alive, one round every `interval_seconds`."""

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
        extender_interval: float = math.inf,
    ) -> None:
        self.manager = manager
        # Each work type's own heartbeat interval; a type not named is renewed every tick.
        self.heartbeat_intervals = heartbeat_intervals or {}
        self.extender_interval = extender_interval
        self.slots = slots
        self.on_lease_lost = on_lease_lost
        self.on_tick = on_tick
        self._by_key: dict[tuple[str, int], Slot] = {}
        self.keeper = LeaseKeeper(
            manager, on_lost=self._lost, max_failures=max_failures, renew_below=0.5
        )
        super().__init__(name="lease-renewer", interval=interval_seconds, using=manager.using)

    @property
    def rounds(self) -> int:
        return self.keeper.rounds

    @property
    def consecutive_failures(self) -> int:
        return self.keeper.consecutive_failures

    def tick(self) -> None:
        self.renew_now()

    def policy(self, slot: Slot) -> KeptLease:
        """The slot's lease as the keeper sees it now: proof of work while a `beat`-mode
        handler runs, time-based otherwise (a handler that has not started cannot beat)."""
        kept = slot.kept
        interval = self.heartbeat_intervals.get(slot.lease.work_type, self.interval)
        kept.period = min(interval, slot.lease_duration / 4)
        if slot.state is SlotState.RUNNING and slot.spec.heartbeat == "beat":
            kept.policy = WORK
            kept.period = min(kept.period, self.extender_interval)
        else:
            kept.policy = TIME
        return kept

    def tracked(self) -> list[Slot]:
        """The runs whose leases this renewer keeps (not those whose executor died)."""
        return self.slots.renewable()

    def due(self, slot: Slot, now: float) -> bool:
        """Whether the slot's lease is renewed by a round at `now`."""
        return self.keeper.due(self.policy(slot), now, slack=self.interval)

    def renew_now(self) -> None:
        """One renewal round (also called directly by tests)."""
        slots = self.tracked()
        self._by_key = {slot.key: slot for slot in slots}
        # A lease is renewed at the last tick before its period runs out.
        self.keeper.keep([self.policy(slot) for slot in slots], slack=self.interval)
        if slots:
            self._report_silent_runs(slots)
            self._pass_on_cancel_requests()
        if self.on_tick is not None:
            try:
                self.on_tick()
            except (DatabaseUnavailable, DatabaseError) as exc:
                # The process could not prove it is alive: a failed round like any other.
                self.keeper.failed([], exc)

    def _report_silent_runs(self, slots: list[Slot]) -> None:
        """A `beat`-mode run whose handler stopped beating let its lease run out; nothing
        renews it, so no round learns when the item moves on (the sweep recovers it).

        Once its lease has surely expired (a round past its expiry), each round
        asks the database what became of it and reports that: the run is
        abandoned once the lease moved on, as any other fenced-out run.
        """
        now = time.monotonic()
        for slot in slots:
            kept = slot.kept
            if (
                kept.policy == WORK
                and slot.state is SlotState.RUNNING
                and now > kept.renewed_at + slot.lease_duration + self.interval
            ):
                try:
                    error = self.manager.refusal(*slot.key, renewing=True)
                except (DatabaseUnavailable, DatabaseError) as exc:
                    error = exc
                self.on_lease_lost(slot, error)

    def _pass_on_cancel_requests(self) -> None:
        """Tell the runs whose items someone asked to stop (within one tick of the request)."""
        try:
            requested = self.manager.cancel_requests()
        except (DatabaseUnavailable, DatabaseError) as exc:
            logger.warning("could not read the requests to stop: %s", exc)
            return
        for key in requested:
            slot = self._by_key.get(key)
            if slot is not None and not slot.cancel_requested:
                logger.info("%s (token %d) was asked to stop", key[0], key[1])
                slot.request_cancel()

    def _lost(self, kept: KeptLease, error: BaseException) -> None:
        slot = self._by_key.get(kept.key)
        if slot is not None:
            self.on_lease_lost(slot, error)
