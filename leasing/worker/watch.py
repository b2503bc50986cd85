"""Keeping watch over the runs in flight: dead executors, deadlines, lost leases."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import DatabaseError

from ..exceptions import DatabaseUnavailable, LeaseConflictError, LeaseExpiredError
from .executors import ExecutorPool
from .outcomes import Counters, Recorder, one_line
from .slots import AbandonedRuns, Slot, SlotState, SlotTable

logger = logging.getLogger("leasing.worker")


class Watch:
    """What the dispatcher checks every cycle, and what the renewer reports."""

    def __init__(
        self,
        slots: SlotTable,
        pool: ExecutorPool,
        recorder: Recorder,
        counters: Counters,
        on_done: Callable[[Slot], None],
        abandoned: AbandonedRuns | None = None,
    ) -> None:
        self.abandoned = abandoned if abandoned is not None else AbandonedRuns()
        self.slots = slots
        self.pool = pool
        self.recorder = recorder
        self.counters = counters
        self.on_done = on_done

    def supervise(self) -> None:
        """Replace dead executors, hand back their runs, time out runs past their deadline."""
        for slot in self.pool.supervise():
            self.recorder.hand_back(slot, "its executor thread died")
            self.on_done(slot)
        for slot in self.slots.past_deadline(time.monotonic()):
            self._end_past_deadline(slot)

    def _end_past_deadline(self, slot: Slot) -> None:
        """Time out a running run, hand back a queued one; a finished one is being written.

        The table reports a slot once, so a queued slot that starts between the
        two compare-and-sets is tried again as a running one.
        """
        while slot.state in (SlotState.QUEUED, SlotState.RUNNING):
            if self.slots.transition(slot, SlotState.RUNNING, SlotState.ABANDONED):
                # The handler may never return: tell it, write its ending, and
                # let a new executor take its place.
                why = f"timed out after {round(slot.lease.cap_seconds)} s"
                slot.lose(why)
                self.recorder.time_out(slot)
                # Tracked before its executor is replaced: a claim screened in between
                # must see the run on its executor or among the abandoned ones.
                self.abandoned.add(slot, why)
                if slot.executor is not None:  # set with the state, under the table's lock
                    self.pool.retire(
                        slot.executor, f"its handler of {slot.lease.work_item_id} timed out"
                    )
                self.on_done(slot)
                return
            if self.slots.transition(slot, SlotState.QUEUED, SlotState.ABANDONED):
                self.recorder.hand_back(slot, "it waited past its lease's deadline")
                self.on_done(slot)
                return

    def lease_lost(self, slot: Slot, error: BaseException) -> None:
        """The renewer could not keep a lease: the run must stop writing.

        A lease that moved on (force-released, force-failed, recovered by the
        sweep, held by another run, the item gone) fences the run out: it is
        abandoned, its executor replaced, and its item is not claimed again by
        this process while its thread runs. A lease that only expired (still
        this run's: nobody took the item yet), or that the database failed to
        renew, stays tracked: the handler is told, and its ending is still
        tried (fenced by the token, so it lands if nobody took the item).
        """
        if slot.state is SlotState.FINISHED:
            return  # its outcome is being written; the fence decides
        reason = one_line(error)
        slot.fenced_out = moved_on(error)
        slot.lose(reason)
        if self.slots.transition(slot, SlotState.QUEUED, SlotState.ABANDONED):
            # Never started: nothing to finish; the item belongs to the sweep now.
            self._log_lost(slot, reason)
            self.counters.add(lost=1)
            self.on_done(slot)
            return
        if not slot.fenced_out:
            if not slot.lost_logged:
                self._log_lost(slot, reason)
            return
        if self.slots.transition(slot, SlotState.RUNNING, SlotState.ABANDONED):
            self.counters.add(lost=1)
            # Tracked before its executor is replaced: a claim of the item screened in
            # between (`Runtime._screen_claims`) would otherwise see the run nowhere
            # and start a second one beside it.
            if not self.abandoned.add(slot, f"its lease was lost ({reason})"):
                self._log_lost(slot, reason)
            if slot.executor is not None:
                self.pool.retire(
                    slot.executor, f"its handler of {slot.lease.work_item_id} lost its lease"
                )
            self.on_done(slot)

    def _log_lost(self, slot: Slot, reason: str) -> None:
        slot.lost_logged = True
        logger.warning(
            "lease on %s (token %d) lost: %s", slot.lease.work_item_id, slot.lease.token, reason
        )


def moved_on(error: BaseException) -> bool:
    """Whether a renewal's refusal says the lease is no longer this run's.

    `LeaseExpiredError` alone: still this run's, only expired (its ending can
    still land); a database failure says nothing either way.
    """
    if isinstance(error, DatabaseUnavailable | DatabaseError):
        return False
    return not (isinstance(error, LeaseExpiredError) and not isinstance(error, LeaseConflictError))
