"""Claims under real concurrency: processes and threads with their own connections."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import time_machine

from leasing import LeaseManager
from leasing.exceptions import LeaseExpiredError
from leasing.models import WorkItem
from tests.support.helpers import database_now
from tests.support.transition_guard import arranging

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_threads_racing_for_one_item_exactly_one_wins(make_items, threads):
    for _round in range(20):
        [item] = make_items(1)
        results = threads(2, lambda i: LeaseManager(f"racer-{i}").acquire_lease())
        winners = [lease for lease in results if lease is not None]
        assert len(winners) == 1, results
        row = WorkItem.objects.get(pk=item.pk)
        assert row.lease_holder == winners[0].worker_id
        assert row.lease_token == 1
        with arranging():  # a fresh table for the next round
            WorkItem.objects.filter(pk=item.pk).delete()


def test_many_threads_batch_claim_disjoint_sets(make_items, threads):
    make_items(200)
    managers = [LeaseManager(f"batcher-{i}") for i in range(8)]

    def claim_all(i: int) -> list[str]:
        got: list[str] = []
        while batch := managers[i].acquire_leases(7, lease_duration_seconds=60):
            got += [lease.work_item_id for lease in batch]
        return got

    results = threads(8, claim_all)
    every = [item_id for got in results for item_id in got]
    assert len(every) == len(set(every)) == 200
    assert WorkItem.objects.in_progress().count() == 200


@pytest.mark.parametrize("shift", [timedelta(minutes=-10), timedelta(minutes=10)])
def test_leases_expire_by_the_database_clock_not_the_process_clock(make_items, shift):
    [item] = make_items(1)
    manager = LeaseManager("skewed")
    db_before = database_now()
    with time_machine.travel(db_before + shift, tick=True):
        lease = manager.acquire_lease(lease_duration_seconds=1)
        # Expiry is one second after the database's now, whatever this process thinks.
        assert abs((lease.expires_at - db_before).total_seconds() - 1) < 0.5
        assert manager.renew_lease(item.pk, lease_duration_seconds=1)
        time.sleep(1.3)
        with pytest.raises(LeaseExpiredError):
            manager.renew_lease(item.pk, lease_duration_seconds=1)
    assert WorkItem.objects.expired().filter(pk=item.pk).exists()


@pytest.mark.postgres
def test_a_deadlocked_complete_and_acquire_changes_nothing_and_runs_again(make_items):
    """A real lock cycle: PostgreSQL aborts the statement, which leaves no trace.

    The worker runs such a statement again (tests/db/test_worker.py); this shows
    that doing so is safe. One statement claims `waiting` and then blocks on
    completing `held`, which another transaction has locked; that transaction
    then asks for `waiting`.
    """
    import threading

    import psycopg
    from django.db import OperationalError, connection, connections

    from leasing.services.completion import complete_and_claim as complete_and_claim_items
    from leasing.services.terms import claim_filters, claim_terms
    from leasing.sql.runner import is_lock_conflict
    from tests.support.helpers import database_url

    held, waiting = make_items(2)
    manager = LeaseManager("deadlocked")
    [held_lease] = manager.acquire_leases(1, 60)
    assert held_lease.work_item_id == held.pk
    terms, filters = claim_terms(60), claim_filters()

    other = psycopg.connect(database_url())
    outcome: dict[str, object] = {}

    def complete_and_claim() -> None:
        try:
            outcome["result"] = complete_and_claim_items(
                manager, [(held_lease, None)], 1, terms, filters
            )
        except Exception as exc:
            outcome["error"] = exc
        finally:
            connections.close_all()

    def blocked_statements() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE %s",
                ["%WITH done AS%"],
            )
            return cursor.fetchone()[0]

    try:
        # This side must not be the one PostgreSQL picks to abort.
        other.execute("SET deadlock_timeout = '60s'")
        other.execute("SELECT 1 FROM work_items WHERE work_item_id = %s FOR UPDATE", [held.pk])
        thread = threading.Thread(target=complete_and_claim)
        thread.start()
        deadline = time.monotonic() + 10
        while blocked_statements() == 0:
            assert time.monotonic() < deadline, "the statement never blocked"
            time.sleep(0.02)
        # Blocks until PostgreSQL breaks the cycle by aborting the other statement.
        other.execute("SELECT 1 FROM work_items WHERE work_item_id = %s FOR UPDATE", [waiting.pk])
        thread.join(10)
    finally:
        other.rollback()
        other.close()

    error = outcome.get("error")
    assert isinstance(error, OperationalError) and is_lock_conflict(error), outcome
    rows = {row.pk: row for row in WorkItem.objects.all()}
    assert (rows[held.pk].status, rows[held.pk].lease_token) == ("in_progress", 1)
    assert (rows[waiting.pk].status, rows[waiting.pk].lease_token) == ("pending", 0)

    done, leases = complete_and_claim_items(manager, [(held_lease, None)], 1, terms, filters)
    assert (done.completed, done.lost) == ((held_lease,), ())
    assert [lease.work_item_id for lease in leases] == [waiting.pk]


@pytest.mark.postgres
def test_a_renewal_skips_a_row_another_transaction_holds_and_waits_for_none(make_items):
    """A renewal never waits on one lease's row while it holds the rest of its batch.

    A worker's completion of finished items locks their rows while its renewer
    renews a batch holding some of them; a renewal that waited there, holding
    the others, made a lock cycle with a completion taking them in another
    order (a second for the deadlock detector, then a failed renewal round).
    The locked lease is now skipped: neither renewed nor lost, still held, and
    renewed by the next round.
    """
    import threading

    import psycopg
    from django.db import connections

    from tests.support.helpers import database_url

    free, locked = make_items(2)
    manager = LeaseManager("renewer")
    assert {lease.work_item_id for lease in manager.acquire_leases(2, 60)} == {free.pk, locked.pk}
    before = dict(WorkItem.objects.values_list("pk", "lease_expires_at"))
    other = psycopg.connect(database_url())
    outcome: dict[str, object] = {}

    def renew() -> None:
        try:
            outcome["result"] = manager.renew_leases(lease_duration_seconds=600)
        except Exception as exc:
            outcome["error"] = exc
        finally:
            connections.close_all()

    try:
        other.execute("SET lock_timeout = '2s'")
        # Holds the row's lock, as a completion being written does.
        other.execute("SELECT 1 FROM work_items WHERE work_item_id = %s FOR UPDATE", [locked.pk])
        thread = threading.Thread(target=renew)
        thread.start()
        thread.join(5)
        waited = thread.is_alive()
        # The completion's next row: the renewal holds no lock on it any more.
        other.execute("SELECT 1 FROM work_items WHERE work_item_id = %s FOR UPDATE", [free.pk])
    finally:
        other.rollback()
        other.close()
    thread.join(10)

    assert not waited, "the renewal waited for the locked row"
    assert outcome.get("result") == ({free.pk}, set()), outcome
    after = dict(WorkItem.objects.values_list("pk", "lease_expires_at"))
    assert after[free.pk] > before[free.pk]
    assert after[locked.pk] == before[locked.pk]
    assert {lease.work_item_id for lease in manager.held_leases()} == {free.pk, locked.pk}
    # Once the lock is gone, the next round renews it.
    assert manager.renew_leases(lease_duration_seconds=600) == ({free.pk, locked.pk}, set())
