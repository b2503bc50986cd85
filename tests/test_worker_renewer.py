"""The worker's lease renewer: one round renews every renewable slot, keyed by lease."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from leasing import LeaseManager
from leasing.handlers import registry
from leasing.models import WorkItem
from leasing.sql.runner import database_now
from leasing.worker.renewer import LeaseRenewer
from leasing.worker.slots import Slot, SlotState, SlotTable

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
    import time

    import psycopg
    from django.db import connections

    from tests.conftest import database_url

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
