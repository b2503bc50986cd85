"""The worker's lease renewer: one round renews every renewable slot, keyed by lease."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from leasing import LeaseManager, enqueue, signals
from leasing.handlers import registry
from leasing.models import WorkItem
from leasing.worker.options import WorkerOptions
from leasing.worker.renewer import LeaseRenewer
from leasing.worker.runtime import WorkerRuntime
from leasing.worker.slots import Slot, SlotState, SlotTable
from tests.support.helpers import database_now
from tests.testapp.handlers import sleep

pytestmark = pytest.mark.django_db(transaction=True)


def slots_for(leases, duration: float) -> SlotTable:
    table = SlotTable()
    table.add_all([Slot(lease, registry.get("test.noop"), duration) for lease in leases])
    return table


def test_a_round_renews_all_leases_and_reports_lost_ones(make_items):
    make_items(4, work_type="test.noop")
    manager = LeaseManager("renewer")
    # Under half of the renewed 60 s lease left, so the round extends it.
    leases = manager.acquire_leases(4, lease_duration_seconds=20)
    WorkItem.objects.filter(pk=leases[0].id).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )
    table = slots_for(leases, 60.0)
    for slot in table:
        slot.heartbeat.beat()
    lost: list[tuple[str, int]] = []
    ticks: list[int] = []
    renewer = LeaseRenewer(
        manager,
        table,
        interval_seconds=10,
        on_lease_lost=lambda slot, exc: lost.append(slot.key),
        on_tick=lambda: ticks.append(1),
    )
    renewer.renew_now()
    assert lost == [leases[0].key]
    assert ticks == [1]
    for lease in leases[1:]:
        row = WorkItem.objects.get(pk=lease.id)
        assert row.lease_expires_at - row.heartbeat_at == timedelta(seconds=60)
        assert row.progress_at is not None and row.progress_at <= row.heartbeat_at


def test_a_run_whose_executor_died_is_not_renewed(make_items):
    make_items(2, work_type="test.noop")
    manager = LeaseManager("renewer")
    leases = manager.acquire_leases(2, lease_duration_seconds=20)
    table = slots_for(leases, 20.0)
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    running, orphan = list(table)
    live = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
    live.start()
    for slot, thread in ((running, live), (orphan, dead)):
        assert table.start(slot, thread)
        thread.slot = slot  # type: ignore[attr-defined]
    renewer = LeaseRenewer(manager, table, interval_seconds=10, on_lease_lost=lambda *a: None)
    assert renewer.tracked() == [running]
    assert orphan.state is SlotState.RUNNING


@pytest.mark.postgres
def test_a_lease_whose_row_another_transaction_holds_is_skipped_and_named_when_at_risk(
    make_items, caplog
):
    """Skipped, not lost; once half its lease went unrenewed the round says why."""
    import psycopg
    from django.db import connections

    from tests.support.helpers import database_url

    make_items(2, work_type="test.noop")
    manager = LeaseManager("renewer")
    leases = manager.acquire_leases(2, lease_duration_seconds=60)
    table = slots_for(leases, 60.0)
    free, held = list(table)
    for slot in (free, held):
        slot.renewed_at = time.monotonic() - 40  # over half of the 60 s lease ago
    before = WorkItem.objects.get(pk=held.lease.id).heartbeat_at
    lost: list[tuple[str, int]] = []
    renewer = LeaseRenewer(
        manager, table, interval_seconds=10, on_lease_lost=lambda slot, exc: lost.append(slot.key)
    )
    with connections["default"].cursor() as cursor:
        cursor.execute("SET lock_timeout = '5s'")  # a renewal that waited fails, not hangs
    other = psycopg.connect(database_url())
    try:
        # A handler's transaction open around its checkpoint holds this lock.
        other.execute("SELECT 1 FROM work_items WHERE work_item_id = %s FOR SHARE", [held.lease.id])
        with caplog.at_level("WARNING", logger="leasing.worker"):
            renewer.renew_now()
    finally:
        other.rollback()
        other.close()
        connections.close_all()

    assert lost == []
    assert time.monotonic() - free.renewed_at < 5
    assert time.monotonic() - held.renewed_at > 30
    assert WorkItem.objects.get(pk=held.lease.id).heartbeat_at == before
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and held.lease.work_item_id in warnings[0], warnings
    assert "another transaction holds its row" in warnings[0]


def ticking_every_3s_for_a_30s_type(manager: LeaseManager, table: SlotTable) -> LeaseRenewer:
    """A renewer of a process whose shortest interval is 3 s, holding leases of a 30 s type."""
    return LeaseRenewer(
        manager,
        table,
        interval_seconds=3,
        on_lease_lost=lambda *a: None,
        heartbeat_intervals={"test.noop": 30.0},
    )


def test_a_lease_is_renewed_on_its_own_types_interval(make_items):
    """The renewer ticks every 3 s (the shortest interval it serves); a lease of a 30 s
    type is left alone until one more tick would leave it unrenewed for 30 s."""
    make_items(2, work_type="test.noop")
    manager = LeaseManager("renewer")
    leases = manager.acquire_leases(2, lease_duration_seconds=300)
    table = slots_for(leases, 300.0)
    fresh, older = list(table)
    older.renewed_at = time.monotonic() - 28  # 31 s unrenewed by the next tick
    renewer = ticking_every_3s_for_a_30s_type(manager, table)
    heartbeats = {lease.id: WorkItem.objects.get(pk=lease.id).heartbeat_at for lease in leases}
    renewer.renew_now()

    assert WorkItem.objects.get(pk=fresh.lease.id).heartbeat_at == heartbeats[fresh.lease.id]
    assert WorkItem.objects.get(pk=older.lease.id).heartbeat_at > heartbeats[older.lease.id]
    assert time.monotonic() - older.renewed_at < 5


def test_a_renewal_period_never_exceeds_a_quarter_of_the_lease(make_items):
    """A 30 s interval on a 40 s lease: renewed once 10 s (one tick early: 7 s) have passed."""
    make_items(2, work_type="test.noop")
    manager = LeaseManager("renewer")
    leases = manager.acquire_leases(2, lease_duration_seconds=40)
    table = slots_for(leases, 40.0)
    recent, due = list(table)
    now = time.monotonic()
    recent.renewed_at, due.renewed_at = now - 6, now - 7.5
    renewer = ticking_every_3s_for_a_30s_type(manager, table)
    assert not renewer.due(recent, now) and renewer.due(due, now)
    renewer.renew_now()
    assert time.monotonic() - due.renewed_at < 5
    assert time.monotonic() - recent.renewed_at > 5


def test_a_worker_renews_each_type_on_its_own_interval():
    """One process serving a 0.2 s type and a 5 s type: during a 1.2 s run, only the
    first one's lease is written between its claim and its completion."""
    registry.register("test.sleep_slow_beat", sleep, heartbeat_interval=5, lease_duration=60)
    renewed: list[str] = []

    def on_renewed(sender, **event):
        renewed.append(event["work_item_id"])

    signals.lease_renewed.connect(on_renewed, weak=False)
    try:
        quick = enqueue("quick", "test.sleep", {"seconds": 1.2})
        slow = enqueue("slow", "test.sleep_slow_beat", {"seconds": 1.2})
        summary = WorkerRuntime(
            WorkerOptions(
                concurrency=2,
                burst=True,
                poll_interval=0.05,
                heartbeat_interval=0.2,
                lease_seconds=10,
                work_types=("test.sleep", "test.sleep_slow_beat"),
            )
        ).run()
    finally:
        signals.lease_renewed.disconnect(on_renewed)
        registry.unregister("test.sleep_slow_beat")
    assert summary.completed == 2
    assert renewed.count(quick.pk) >= 3, renewed
    assert slow.pk not in renewed
