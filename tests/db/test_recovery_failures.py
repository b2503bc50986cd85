"""The recovery sweep when a batch fails, deadlocks or loses its database."""

from __future__ import annotations

import pytest
from django.db import connection

from leasing import LeaseManager, enqueue, enqueue_many
from leasing.exceptions import DatabaseUnavailable
from leasing.models import Checkpoint, Worker, WorkItem
from leasing.storage.postgres import PostgresStorage
from leasing.storage.sqlite import SQLiteStorage
from tests.support.helpers import raise_deadlock, row, wait_for
from tests.support.recovery import boundaries, expire, sweep

pytestmark = pytest.mark.django_db

# A batch's recovery, on either database (the tests make it fail).
STORAGES = (PostgresStorage, SQLiteStorage)


def test_a_failing_batch_is_rolled_back_and_its_rows_recovered_one_by_one(db, monkeypatch):
    items = enqueue_many([{"task_id": f"t{i}", "work_type": "noop"} for i in range(3)])
    LeaseManager("w").acquire_leases(3)
    expire(*[i.pk for i in items])
    s = sweep()
    calls = {"n": 0}

    # Fails after the batch's UPDATE and checkpoints, still inside its transaction.
    def flaky(real):
        def batch(*args, **kwargs):
            outcome = real(*args, **kwargs)
            calls["n"] += 1
            if calls["n"] == 1:
                assert outcome.requeued == 3 and outcome.checkpoints == 3
                raise RuntimeError("disk full")
            return outcome

        return batch

    for storage in STORAGES:
        monkeypatch.setattr(storage, "recover", flaky(storage.recover))

    stats = s.scan_and_recover()
    # The batch rolled back whole; each row was then recovered on its own.
    assert calls["n"] == 4
    assert (stats.errors, stats.recovered, stats.expired_found, stats.unrecovered) == (
        0,
        3,
        3,
        (),
    )
    assert WorkItem.objects.pending().count() == 3
    assert [len(boundaries(i.pk)) for i in items] == [1, 1, 1]


def test_a_batch_aborted_by_a_deadlock_runs_again_in_the_same_pass(db, monkeypatch, caplog):
    items = enqueue_many([{"task_id": f"t{i}", "work_type": "noop"} for i in range(3)])
    LeaseManager("w").acquire_leases(3)
    expire(*[i.pk for i in items])
    aborted = []

    def deadlock_once(real):
        def batch(*args, **kwargs):
            if not aborted:
                outcome = real(*args, **kwargs)  # its writes roll back with the error
                aborted.append(outcome)
                raise_deadlock()
            return real(*args, **kwargs)

        return batch

    for storage in STORAGES:
        monkeypatch.setattr(storage, "recover", deadlock_once(storage.recover))

    with caplog.at_level("WARNING", logger="leasing.sweep"):
        stats = sweep().scan_and_recover()

    assert aborted and aborted[0].requeued == 3
    assert (stats.errors, stats.expired_found, stats.recovered, stats.batches) == (0, 3, 3, 1)
    assert WorkItem.objects.pending().count() == 3
    assert Checkpoint.objects.count() == 3  # the aborted batch's checkpoints are gone
    assert "a batch was aborted (deadlock detected); running it again" in caplog.text


def test_a_batch_that_keeps_deadlocking_is_given_up_for_this_pass(db, monkeypatch):
    item = enqueue("t", "noop")
    LeaseManager("w").acquire_lease()
    expire(item.pk)

    def always_deadlocks(*args, **kwargs):
        raise_deadlock()

    for storage in STORAGES:
        monkeypatch.setattr(storage, "recover", always_deadlocks)

    stats = sweep().scan_and_recover()
    assert (stats.errors, stats.recovered) == (1, 0)
    assert row(item.pk)["status"] == "in_progress"


@pytest.mark.django_db(transaction=True)
def test_background_sweep_survives_a_database_outage(db, monkeypatch):
    from leasing.sweep import sweep as sweep_module

    real = sweep_module.database_now
    outages = {"left": 2}

    def down(using: str = "default"):
        if outages["left"]:
            outages["left"] -= 1
            raise DatabaseUnavailable("Database unavailable: connection refused")
        return real(using)

    monkeypatch.setattr(sweep_module, "database_now", down)
    item = enqueue("t", "noop")
    LeaseManager("w").acquire_lease()
    expire(item.pk)
    s = sweep(scan_interval_seconds=0.05)
    s.start()
    try:
        wait_for(lambda: row(item.pk)["status"] == "pending")
        wait_for(lambda: s.get_statistics()["total_recovered"] == 1)
        assert s.get_statistics()["total_errors"] == 2
        assert s.is_running()
    finally:
        s.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_requeued_items_wake_listening_workers_on_commit_failed_ones_do_not(db):
    import psycopg

    from leasing.sql.new_items import NOTIFY_CHANNEL
    from tests.support.helpers import database_url

    retried = enqueue("t", "noop", queue_name="q-retry")
    failed = enqueue("t", "noop", queue_name="q-final", max_retries=0)
    assert len(LeaseManager("w").acquire_leases(2)) == 2
    expire(retried.pk, failed.pk)
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
        stats = sweep().scan_and_recover()
        payloads = [n.payload for n in listener.notifies(timeout=0.5)]
    assert (stats.recovered, stats.failed) == (1, 1)
    assert payloads == ["q-retry"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_background_sweep_reconnects_after_its_connection_is_killed(db):
    s = sweep(scan_interval_seconds=0.05)
    s.start()
    try:
        wait_for(lambda: s.get_statistics()["total_scans"] >= 1)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        item = enqueue("t", "noop")
        LeaseManager("w").acquire_lease()
        expire(item.pk)
        wait_for(lambda: row(item.pk)["status"] == "pending")
        assert s.get_statistics()["total_errors"] >= 1
        assert s.is_running()
    finally:
        s.stop()
    assert Worker.objects.get(pk=s.worker_id).status == "stopped"


def _refuse_updates_of(item_id: str, vendor: str) -> None:
    """Make the database refuse any change to one row (a row that cannot be recovered)."""
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION refuse_row() RETURNS trigger AS $$ BEGIN "
                "RAISE EXCEPTION 'row refused'; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                "CREATE TRIGGER refuse_row BEFORE UPDATE ON work_items FOR EACH ROW "
                f"WHEN (OLD.work_item_id = '{item_id}') EXECUTE FUNCTION refuse_row()"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER refuse_row BEFORE UPDATE ON work_items "
                f"WHEN OLD.work_item_id = '{item_id}' BEGIN SELECT RAISE(ABORT, 'row refused'); END"
            )


def test_one_row_the_database_refuses_is_left_as_it_was_and_the_batch_proceeds(
    db, vendor, caplog, viewer_client
):
    items = enqueue_many([{"task_id": f"t{i}", "work_type": "noop"} for i in range(5)])
    LeaseManager("w").acquire_leases(5)
    expire(*[i.pk for i in items])
    bad = items[2].pk
    _refuse_updates_of(bad, vendor)
    s = sweep()

    with caplog.at_level("ERROR", logger="leasing.sweep"):
        stats = s.scan_and_recover()

    assert (stats.expired_found, stats.recovered, stats.errors) == (5, 4, 1)
    assert stats.unrecovered == (bad,)
    assert row(bad)["status"] == "in_progress"  # left as it was
    assert [row(i.pk)["status"] for i in items if i.pk != bad] == ["pending"] * 4
    assert f"could not recover {bad}" in caplog.text
    assert Worker.objects.get(pk=s.worker_id).last_scan_stats["unrecovered"] == [bad]
    # The console shows it, linked.
    from tests.support.admin import dashboard_url

    page = viewer_client.get(dashboard_url()).content.decode()
    assert "The last sweep could not recover 1 expired lease" in page
    assert bad in page
