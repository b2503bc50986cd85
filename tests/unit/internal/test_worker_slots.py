"""The worker's slot table, its watch over deadlines, its executor pool's queue and a run's
loss flag, on their own.

No database: slots are built from leases made by hand, and the executors run
handlers that never touch a connection.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from leasing.context import WorkContext
from leasing.exceptions import DatabaseUnavailable, LeaseExpiredError
from leasing.handlers import HandlerSpec
from leasing.heartbeat import Heartbeat
from leasing.services.held import Lease
from leasing.worker.executors import ExecutorPool
from leasing.worker.outcomes import Counters
from leasing.worker.slots import Slot, SlotState, SlotTable
from leasing.worker.watch import Watch

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def lease(item: str, *, cap_seconds: float = 10.0, token: int = 1) -> Lease:
    return Lease(
        item,
        f"task-{item}",
        "unit.noop",
        "default",
        0,
        None,
        token,
        "unit-worker",
        NOW,
        NOW + timedelta(seconds=60),
        NOW + timedelta(seconds=cap_seconds),
        0,
        3,
        0,
        NOW,
    )


def spec(func=lambda ctx: None) -> HandlerSpec:
    return HandlerSpec(work_type="unit.noop", func=func)


def slot(item: str, *, claimed_at: float, cap_seconds: float) -> Slot:
    return Slot(lease(item, cap_seconds=cap_seconds), spec(), 60.0, claimed_at)


# --- the renewer's record ------------------------------------------------------------------


def test_a_slot_counts_from_its_claim_until_a_renewal_and_its_record_keeps_what_renewals_set():
    run = slot("kept", claimed_at=100.0, cap_seconds=10.0)
    assert run.renewed_at == 100.0
    kept = run.kept  # what the renewer sees: made the first time it looks
    assert (kept.key, kept.duration, kept.period, kept.renewed_at) == (run.key, 60.0, 15.0, 100.0)
    assert kept.progress is run.heartbeat
    run.renewed_at = 130.0
    assert run.kept is kept and kept.renewed_at == 130.0
    fresh = slot("fresh", claimed_at=time.monotonic(), cap_seconds=10.0)
    assert not fresh.lease_surely_expired()
    fresh.renewed_at = time.monotonic() - 61.0  # its 60 s lease ran out since
    assert fresh.lease_surely_expired()


# --- deadlines ---------------------------------------------------------------------------


def test_a_slots_deadline_is_its_claim_plus_its_leases_cap():
    s = slot("a", claimed_at=100.0, cap_seconds=10.0)
    assert s.deadline() == 110.0
    assert s.key == ("a", 1)


def test_past_deadline_reads_the_table_only_once_a_deadline_passed():
    table = SlotTable()
    early = slot("early", claimed_at=100.0, cap_seconds=10.0)  # due at 110
    late = slot("late", claimed_at=100.0, cap_seconds=50.0)  # due at 150
    table.add_all([early, late])
    assert table.earliest_deadline() == 110.0
    assert table.past_deadline(109.9) == []
    assert table.past_deadline(110.0) == [early]
    # Until the next deadline the table is not read again.
    assert table.earliest_deadline() == 150.0
    assert table.past_deadline(120.0) == []
    # Reporting removes nothing: a due slot nobody removed is reported again.
    assert table.past_deadline(151.0) == [early, late]
    table.remove_all([early, late])
    assert table.past_deadline(1000.0) == []


def test_a_slot_added_later_with_an_earlier_deadline_is_not_overslept():
    table = SlotTable()
    table.add_all([slot("long", claimed_at=100.0, cap_seconds=100.0)])  # due at 200
    assert table.past_deadline(150.0) == []
    short = slot("short", claimed_at=110.0, cap_seconds=10.0)  # due at 120
    table.add_all([short])
    assert table.earliest_deadline() == 120.0
    assert table.past_deadline(130.0) == [short]


def test_an_empty_table_has_no_deadline():
    table = SlotTable()
    assert table.earliest_deadline() == float("inf")
    assert table.past_deadline(1e12) == []


def test_remove_all_drops_only_the_slots_still_under_their_keys():
    table = SlotTable()
    first = slot("a", claimed_at=0.0, cap_seconds=10.0)
    table.add_all([first, slot("b", claimed_at=0.0, cap_seconds=10.0)])
    again = Slot(lease("a"), spec(), 60.0, 0.0)  # a new run under the same key
    table.add_all([again])
    table.remove_all([first])
    assert table.get(("a", 1)) is again
    assert table.get(("b", 1)) is not None


# --- the executor pool's queue -----------------------------------------------------------


def pool_with(func, concurrency: int, outputs: list) -> tuple[ExecutorPool, SlotTable]:
    table = SlotTable()
    pool = ExecutorPool(
        concurrency=concurrency,
        using="default",
        slots=table,
        recorder=None,  # type: ignore[arg-type]  # no run fails here
        on_output=lambda s, output: outputs.append(s.key[0]),
        on_done=lambda s: None,
        stopping=lambda: False,
    )
    return pool, table


def test_one_batch_reaches_every_idle_executor():
    # Three handlers that each wait for the other two: they finish only if the
    # one hand-over of the batch woke all three executors.
    barrier = threading.Barrier(3, timeout=10)
    outputs: list[str] = []
    pool, table = pool_with(lambda ctx: barrier.wait(), 3, outputs)
    pool.start()
    time.sleep(0.05)  # the executors wait for work
    slots = [Slot(lease(i), spec(lambda ctx: barrier.wait()), 60.0) for i in "abc"]
    table.add_all(slots)
    pool.submit(slots)
    deadline = time.monotonic() + 10
    while len(outputs) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    pool.stop()
    assert sorted(outputs) == ["a", "b", "c"]
    assert not barrier.broken
    assert all(s.state is SlotState.FINISHED for s in slots)


def test_one_executor_runs_a_batch_in_claim_order_and_stop_lets_it_finish():
    outputs: list[str] = []
    pool, table = pool_with(lambda ctx: None, 1, outputs)
    slots = [Slot(lease(str(i)), spec(), 60.0) for i in range(50)]
    table.add_all(slots)
    pool.submit(slots)
    assert pool.backlog() == 50
    pool.start()
    pool.stop()  # queued after the batch: the executor ends once it ran it
    for executor in list(pool.executors):
        executor.join(10)
        assert not executor.is_alive()
    assert outputs == [str(i) for i in range(50)]
    assert pool.backlog() == 0


# --- a run's loss flag -------------------------------------------------------------------


def test_a_loss_marked_before_the_wait_is_seen_at_once():
    context = WorkContext(lease("a"), Heartbeat())
    assert not context.lease_lost
    context.mark_lease_lost("recovered by the sweep")
    assert context.lease_lost
    assert context.wait_lease_lost(0) is True
    assert context.lease_lost_reason == "recovered by the sweep"


def test_a_loss_marked_during_a_wait_wakes_the_waiter():
    context = WorkContext(lease("a"), Heartbeat())
    assert context.wait_lease_lost(0.01) is False
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(context.wait_lease_lost(10)))
    waiter.start()
    time.sleep(0.05)
    started = time.monotonic()
    context.mark_lease_lost("force-released")
    waiter.join(10)
    assert woke == [True]
    assert time.monotonic() - started < 5
    # The first reason stays.
    context.mark_lease_lost("something else")
    assert context.lease_lost_reason == "force-released"


# --- the watch over deadlines ------------------------------------------------------------


class StartsDuringTheWatch(SlotTable):
    """A table where an executor starts the slot right after the watch's first try."""

    def __init__(self, executor: threading.Thread) -> None:
        super().__init__()
        self.executor = executor
        self.tries: list[tuple[SlotState, SlotState]] = []

    def transition(self, slot: Slot, expected: SlotState, new: SlotState) -> bool:
        self.tries.append((expected, new))
        done = super().transition(slot, expected, new)
        if len(self.tries) == 1:
            assert self.start(slot, self.executor)  # queued -> running, in between
        return done


class Calls:
    """Stands in for the recorder and the pool: remembers what the watch asked of them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def time_out(self, slot: Slot) -> None:
        self.calls.append(("time_out", slot.key))

    def hand_back(self, slot: Slot, why: str) -> None:
        self.calls.append(("hand_back", slot.key))

    def retire(self, executor: threading.Thread, why: str) -> None:
        self.calls.append(("retire", executor))

    def supervise(self) -> list[Slot]:
        return []


def test_a_queued_slot_that_starts_while_it_is_timed_out_is_timed_out_as_running():
    executor = threading.Thread(target=lambda: None)
    table = StartsDuringTheWatch(executor)
    due = Slot(lease("late", cap_seconds=1.0), spec(), 60.0, time.monotonic() - 5)
    table.add_all([due])
    calls = Calls()
    done: list[Slot] = []
    Watch(table, calls, calls, Counters(), done.append).supervise()  # type: ignore[arg-type]
    # Tried as running (it was queued), then as queued (it had started), then
    # as running again: timed out, its executor replaced.
    assert table.tries == [
        (SlotState.RUNNING, SlotState.ABANDONED),
        (SlotState.QUEUED, SlotState.ABANDONED),
        (SlotState.RUNNING, SlotState.ABANDONED),
    ]
    assert calls.calls == [("time_out", ("late", 1)), ("retire", executor)]
    assert due.state is SlotState.ABANDONED
    assert done == [due]
    assert due.context is None or due.context.lease_lost


def test_a_queued_slot_past_its_deadline_is_handed_back_once():
    table = SlotTable()
    due = Slot(lease("late", cap_seconds=1.0), spec(), 60.0, time.monotonic() - 5)
    fine = Slot(lease("fine", cap_seconds=3600.0), spec(), 60.0)
    table.add_all([due, fine])
    calls = Calls()
    done: list[Slot] = []
    watch = Watch(table, calls, calls, Counters(), done.append)  # type: ignore[arg-type]
    watch.supervise()
    watch.supervise()
    assert calls.calls == [("hand_back", ("late", 1))]
    assert done == [due]
    assert fine.state is SlotState.QUEUED


class BlockedExecutor(threading.Thread):
    """An executor thread whose handler blocks until `release` is set."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.release = threading.Event()
        self.slot: Slot | None = None
        self.child = None  # a handler thread: no child process

    def run(self) -> None:
        self.release.wait(30)
        self.slot = None


def running_slot(table: SlotTable, item: str) -> tuple[Slot, BlockedExecutor]:
    slot = Slot(lease(item), spec(), 60.0)
    table.add_all([slot])
    executor = BlockedExecutor()
    executor.start()
    assert table.start(slot, executor)  # type: ignore[arg-type]
    executor.slot = slot
    return slot, executor


def test_a_running_slot_fenced_out_is_abandoned_once_until_its_thread_lets_go(caplog):
    from leasing.exceptions import LeaseLostError
    from leasing.worker.slots import AbandonedRuns

    table, calls, abandoned = SlotTable(), Calls(), AbandonedRuns()
    counters = Counters()
    done: list[Slot] = []
    watch = Watch(table, calls, calls, counters, done.append, abandoned)  # type: ignore[arg-type]
    slot, executor = running_slot(table, "hung")
    with caplog.at_level("INFO", logger="leasing.worker"):
        for _ in range(3):  # the renewer reports a lost lease every round
            watch.lease_lost(slot, LeaseLostError("it is now pending (force-released)"))
        assert slot.state is SlotState.ABANDONED
        assert calls.calls == [("retire", executor)]
        assert done == [slot] and counters.lost == 1
        assert [s.key for s in abandoned.alive()] == [("hung", 1)]
        assert abandoned.total == 1
        executor.release.set()
        executor.join(5)
        assert abandoned.alive() == []
    lines = [r.getMessage() for r in caplog.records]
    assert sum("abandoned the run of hung" in line for line in lines) == 1, lines
    assert sum("the abandoned run of hung (token 1) ended" in line for line in lines) == 1
    assert not any("lease on hung" in line for line in lines)
    assert abandoned.total == 1


def test_a_fenced_out_run_is_tracked_as_abandoned_before_its_executor_is_replaced():
    """A claim of the item screened while the executor is replaced finds the old run
    among the abandoned ones (found by a process test on a loaded CI host: the re-claimed
    item ran a second time beside its abandoned run, and the worker never reached exit 75)."""
    from leasing.exceptions import LeaseLostError
    from leasing.worker.slots import AbandonedRuns

    table, abandoned = SlotTable(), AbandonedRuns()
    tracked_at_retire: list[list[tuple[str, int]]] = []

    class Pool(Calls):
        def retire(self, executor: threading.Thread, why: str) -> None:
            tracked_at_retire.append([s.key for s in abandoned.alive()])
            super().retire(executor, why)

    pool = Pool()
    watch = Watch(table, pool, pool, Counters(), lambda s: None, abandoned)  # type: ignore[arg-type]
    slot, executor = running_slot(table, "hung")
    try:
        watch.lease_lost(slot, LeaseLostError("it is now pending (force-released)"))
        assert tracked_at_retire == [[("hung", 1)]]
    finally:
        executor.release.set()
        executor.join(5)


@pytest.mark.parametrize(
    "error",
    [
        DatabaseUnavailable("connection refused"),
        # Still this run's, only expired: nobody took the item, so its ending can land.
        LeaseExpiredError("the lease has expired"),
    ],
)
def test_a_lease_not_known_to_have_moved_on_stays_running_and_is_logged_once(caplog, error):
    from leasing.worker.slots import AbandonedRuns

    table, calls, abandoned = SlotTable(), Calls(), AbandonedRuns()
    done: list[Slot] = []
    watch = Watch(table, calls, calls, Counters(), done.append, abandoned)  # type: ignore[arg-type]
    slot, executor = running_slot(table, "offline")
    try:
        with caplog.at_level("WARNING", logger="leasing.worker"):
            for _ in range(3):
                watch.lease_lost(slot, error)
        assert slot.state is SlotState.RUNNING  # its ending is still tried, fenced
        assert slot.context is None or slot.context.lease_lost
        assert len(abandoned) == 0 and done == [] and calls.calls == []
        assert sum("lease on offline" in r.getMessage() for r in caplog.records) == 1
    finally:
        executor.release.set()
        executor.join(5)
