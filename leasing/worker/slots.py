"""The runs a worker process has in flight, keyed by lease (item and token).

A slot is one run of one lease, from its claim until its outcome is written.
The key is `Lease.key`: if an operator force-releases an item (or the sweep
recovers it) and this same process claims it again, the new run is a new
slot, and nothing the old run does (finish, renew, fail) can touch it.

    queued  -> running -> finished -> (removed)
       \\________ abandoned (timed out, lost, or its executor died) -> (removed)

A running slot abandoned while its handler thread still runs is kept in
`AbandonedRuns` until that thread lets go.

A slot's deadline counts from its claim, unless it was claimed ahead of a
free executor (prefetched) and its type has a `timeout`: its timeout then
counts from its start (`SlotTable.start` has the database move the lease's
deadline first), so a wait in this process's queue costs its run nothing.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..context import WorkContext
from ..handlers import HandlerSpec
from ..heartbeat import Heartbeat
from ..keeping import KeptLease
from ..services.held import Lease, LeaseKey

if TYPE_CHECKING:  # the executors import this module
    from .executors import Executor

logger = logging.getLogger("leasing.worker")


class SlotState(enum.Enum):
    QUEUED = "queued"  # claimed, waiting for an executor
    RUNNING = "running"  # its handler runs in `executor`
    FINISHED = "finished"  # handler returned; its outcome is being written
    ABANDONED = "abandoned"  # given up: its lease is no longer ours to keep


class Slot:
    """One run of one lease; built once per claimed item, so a plain class with slots."""

    __slots__ = (
        "_kept",
        "ahead",
        "cancel_requested",
        "claimed_at",
        "context",
        "deadline_at",
        "executor",
        "fenced_out",
        "heartbeat",
        "key",
        "lease",
        "lease_duration",
        "lost_logged",
        "spec",
        "started_at",
        "state",
    )

    def __init__(
        self,
        lease: Lease,
        spec: HandlerSpec,
        lease_duration: float,
        claimed_at: float | None = None,
    ) -> None:
        self.lease = lease
        # What identifies the run (a new claim of the item is a new run).
        self.key: LeaseKey = lease.key
        self.spec = spec
        self.lease_duration = lease_duration
        self.claimed_at = time.monotonic() if claimed_at is None else claimed_at
        # Monotonic time at which the lease reaches its cap.
        self.deadline_at = self.claimed_at + lease.cap_seconds
        self.heartbeat = Heartbeat()
        self.context: WorkContext | None = None
        # Someone asked the item to stop (`leasing.cancel()`): the renewer saw it.
        self.cancel_requested = False
        # The loss of its lease was logged (a loss is reported every renewal round).
        self.lost_logged = False
        # Its lease moved on (force-released, recovered, held by another run): the run
        # can never write again. A lease that only expired is still the run's.
        self.fenced_out = False
        self.state = SlotState.QUEUED
        self.executor: Executor | None = None
        self.started_at: float | None = None
        # Made when the renewer first looks at the run: most runs end before that.
        self._kept: KeptLease | None = None
        # Claimed ahead of a free executor, of a type with a timeout: its timeout
        # counts from its start (set by the dispatcher).
        self.ahead = False

    @property
    def kept(self) -> KeptLease:
        """How the renewer keeps its lease alive (its policy and last renewal)."""
        if self._kept is None:
            self._kept = KeptLease(
                self.key,
                self.lease_duration,
                period=self.lease_duration / 4,
                progress=self.heartbeat,
                renewed_at=self.claimed_at,
            )
        return self._kept

    @property
    def renewed_at(self) -> float:
        """Monotonic time of the claim or the last renewal that held."""
        return self.claimed_at if self._kept is None else self._kept.renewed_at

    @renewed_at.setter
    def renewed_at(self, value: float) -> None:
        self.kept.renewed_at = value

    def deadline(self) -> float:
        """Monotonic time at which the lease reaches its cap."""
        return self.deadline_at

    def lease_surely_expired(self) -> bool:
        """Past the expiry of its last successful renewal: the sweep's item now."""
        return time.monotonic() > self.renewed_at + self.lease_duration

    def elapsed_ms(self) -> float:
        return (time.monotonic() - (self.started_at or self.claimed_at)) * 1000

    def request_cancel(self) -> None:
        """Tell the handler (now, or when it starts) that the item was asked to stop."""
        self.cancel_requested = True
        if self.context is not None:
            self.context.request_cancel()

    def lose(self, reason: str) -> None:
        """Tell the handler its lease is gone: its writes are refused from now on."""
        if self.context is not None:
            self.context.mark_lease_lost(reason)


# Moves a slot's lease deadline to count from its start (in the database, fenced by its
# token) and returns the lease as moved; None if it could not, and ended the slot instead.
StartClock = Callable[[Slot, "Executor"], Lease | None]


class SlotTable:
    """Thread-safe table of the process's slots."""

    def __init__(self, start_clock: StartClock | None = None) -> None:
        self.start_clock = start_clock
        self._slots: dict[LeaseKey, Slot] = {}
        self._lock = threading.Lock()
        # No slot reaches its deadline before this (monotonic): the dispatcher
        # looks for runs past their deadline every cycle, and a scan of a
        # thousand prefetched slots each time cost a tenth of its CPU.
        self._earliest_deadline = math.inf

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)

    def __iter__(self) -> Iterator[Slot]:
        with self._lock:
            return iter(list(self._slots.values()))

    def add_all(self, slots: list[Slot]) -> None:
        """Add a claimed batch under one acquisition of the lock."""
        with self._lock:
            for slot in slots:
                self._slots[slot.key] = slot
                if slot.deadline_at < self._earliest_deadline:
                    self._earliest_deadline = slot.deadline_at

    def earliest_deadline(self) -> float:
        """No slot reaches its deadline before this monotonic time (inf: none in flight)."""
        with self._lock:
            return self._earliest_deadline

    def past_deadline(self, now: float) -> list[Slot]:
        """Slots whose deadline passed by `now` (monotonic); reads the table only when one may have.

        The table is read only once `now` reaches the earliest deadline not yet
        reported. The caller ends the slots it can (queued or running) and
        leaves the rest (finished, abandoned) to whoever removes them; one
        still in the table is reported again by the next read.
        """
        with self._lock:
            if now < self._earliest_deadline:
                return []
            due: list[Slot] = []
            earliest = math.inf
            for slot in self._slots.values():
                if slot.deadline_at <= now:
                    due.append(slot)
                elif slot.deadline_at < earliest:
                    earliest = slot.deadline_at
            self._earliest_deadline = earliest
            return due

    def get(self, key: LeaseKey) -> Slot | None:
        with self._lock:
            return self._slots.get(key)

    def remove(self, slot: Slot) -> bool:
        """Drop the slot if it is still the one under its key; True if it was."""
        with self._lock:
            if self._slots.get(slot.key) is slot:
                del self._slots[slot.key]
                return True
            return False

    def remove_all(self, slots: list[Slot]) -> None:
        """`remove` each of them, under one acquisition of the lock."""
        with self._lock:
            for slot in slots:
                if self._slots.get(slot.key) is slot:
                    del self._slots[slot.key]

    def start(self, slot: Slot, executor: Executor) -> bool:
        """Mark a queued slot running in `executor`; False if it was abandoned meanwhile.

        A slot claimed ahead (`Slot.ahead`) has its lease's deadline moved to
        count from now first, outside the lock (a round trip); if that cannot
        be done, `start_clock` ended the slot and it does not run.
        """
        moved = None
        if slot.ahead and self.start_clock is not None and slot.state is SlotState.QUEUED:
            moved = self.start_clock(slot, executor)
            if moved is None:
                return False
        with self._lock:
            if self._slots.get(slot.key) is not slot or slot.state is not SlotState.QUEUED:
                return False
            slot.state = SlotState.RUNNING
            slot.executor = executor
            slot.started_at = time.monotonic()
            if moved is not None:
                # As at the claim, the local clock is read once the database answered.
                slot.lease = moved
                slot.deadline_at = slot.started_at + moved.cap_seconds
                self._earliest_deadline = min(self._earliest_deadline, slot.deadline_at)
            return True

    def transition(self, slot: Slot, expected: SlotState, new: SlotState) -> bool:
        """Compare-and-set a slot's state (under the table's lock)."""
        with self._lock:
            if slot.state is not expected:
                return False
            slot.state = new
            return True

    def renewable(self) -> list[Slot]:
        """Slots whose lease the process may keep alive.

        Queued ones (an executor will run them), running ones whose executor
        is alive and still on them, finished ones whose outcome is being
        written. A run whose handler thread died, or that was abandoned, is
        never renewed: its lease runs out and the sweep takes over.
        """
        with self._lock:
            slots = list(self._slots.values())
        return [
            slot
            for slot in slots
            if slot.state in (SlotState.QUEUED, SlotState.FINISHED)
            or (
                slot.state is SlotState.RUNNING
                and slot.executor is not None
                and slot.executor.is_alive()
                and getattr(slot.executor, "slot", None) is slot
            )
        ]


class AbandonedRuns:
    """Runs fenced out (timed out, lease lost) whose handler thread still runs, by (item, token).

    Python cannot stop a thread: a handler blocked in a call that never
    returns keeps its executor thread (retired, replaced by a fresh one) for
    as long as it blocks. Each such run is logged once when it is abandoned
    and once when its thread lets go; until then the worker counts it
    (its `workers` row, /metrics, the console) and claims nothing of its item.
    """

    def __init__(self) -> None:
        self._runs: dict[LeaseKey, tuple[Slot, Executor]] = {}
        self._lock = threading.Lock()
        self.total = 0  # every run abandoned since the process started

    def add(self, slot: Slot, why: str) -> bool:
        """Track the slot if its handler still runs in its executor; True if it does."""
        executor = slot.executor
        if executor is None or not _still_on(executor, slot):
            return False
        if executor.child is not None and executor.pool.runs_in_child(slot):
            return False  # its executor stops the child: nothing outlives the run
        with self._lock:
            if slot.key in self._runs:
                return False
            self._runs[slot.key] = (slot, executor)
            self.total += 1
            count = len(self._runs)
        logger.warning(
            "abandoned the run of %s (%s, token %d): %s; its handler thread still runs and "
            "nothing it does is written (%d abandoned run(s) in this process)",
            slot.lease.work_item_id,
            slot.lease.work_type,
            slot.lease.token,
            why,
            count,
        )
        return True

    def alive(self) -> list[Slot]:
        """The abandoned runs whose thread still runs; forgets (and logs) the others."""
        with self._lock:
            ended = [key for key, (slot, ex) in self._runs.items() if not _still_on(ex, slot)]
            gone = [self._runs.pop(key)[0] for key in ended]
            alive = [slot for slot, _ in self._runs.values()]
        for slot in gone:
            logger.info(
                "the abandoned run of %s (token %d) ended after %.0f s",
                slot.lease.work_item_id,
                slot.lease.token,
                slot.elapsed_ms() / 1000,
            )
        return alive

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)


def _still_on(executor: Executor, slot: Slot) -> bool:
    return executor.is_alive() and executor.slot is slot
