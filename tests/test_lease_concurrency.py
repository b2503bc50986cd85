"""Claims under real concurrency: processes and threads with their own connections."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest
import time_machine

from leasing import LeaseManager
from leasing.exceptions import LeaseExpiredError
from leasing.models import Worker, WorkItem
from leasing.sql.runner import database_now
from tests.conftest import wait_for
from tests.transition_guard import arranging
from tests.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_eight_processes_complete_2000_items_exactly_once(make_items, spawn):
    make_items(2000)
    procs = [spawn("-m", "tests.procs.claim_loop", f"proc-{i}", "4") for i in range(8)]
    claims: Counter[str] = Counter()
    per_process = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        ids = [line.split()[0] for line in out.splitlines() if line.strip()]
        per_process.append(len(ids))
        claims.update(ids)

    assert sum(claims.values()) == 2000
    assert len(claims) == 2000
    assert max(claims.values()) == 1, "an item was claimed twice"
    assert WorkItem.objects.completed().count() == 2000
    assert not WorkItem.objects.exclude(status="completed").exists()
    # Every row was claimed once (token 1) by the process that completed it.
    assert set(WorkItem.objects.values_list("lease_token", flat=True)) == {1}
    holders = Counter(WorkItem.objects.values_list("output_data__by", flat=True))
    assert sum(holders.values()) == 2000
    assert sum(1 for n in per_process if n > 0) >= 2, per_process


def test_eight_processes_claiming_by_work_type_complete_each_item_once(make_items, spawn):
    """Claims filtered to three types, each read one branch per type (`sql.candidates`)."""
    make_items(300, task_id="ahead", work_type="other", priority=5)  # never asked for
    for work_type in ("t.a", "t.b", "t.c"):
        make_items(500, work_type=work_type)
    procs = [spawn("-m", "tests.procs.claim_loop", f"p-{i}", "4", "t.a,t.b,t.c") for i in range(8)]
    claims: Counter[str] = Counter()
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        claims.update(line.split()[0] for line in out.splitlines() if line.strip())

    assert len(claims) == 1500 and max(claims.values()) == 1, "an item was claimed twice"
    assert WorkItem.objects.completed().count() == 1500
    assert set(WorkItem.objects.filter(work_type="other").values_list("status", flat=True)) == {
        "pending"
    }
    assert set(WorkItem.objects.completed().values_list("lease_token", flat=True)) == {1}


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


def test_eight_runworker_processes_run_every_item_exactly_once(make_items, spawn, tmp_path):
    # The real worker: batched claims with prefetch, batched fenced completions.
    from django.db import connection

    from leasing import enqueue_many

    record = tmp_path / "runs.txt"
    specs = [{"task_id": f"t{i}", "work_type": "test.noop"} for i in range(2000)]

    def start(*burst: str) -> list[subprocess.Popen[str]]:
        return [
            spawn(
                "manage.py",
                "runworker",
                *burst,
                "--work-type",
                "test.noop",
                env={
                    "LEASING_TEST_RECORD": str(record),
                    "LEASING_LOG_LEVEL": "WARNING",
                    **leasing_env(),
                },
            )
            for _ in range(8)
        ]

    # One process must not drain the table while the others are still starting
    # up (it did, on a slow host). PostgreSQL: behind a gate, the table refuses
    # writes until all eight wait on their first claim. SQLite has no such gate:
    # the eight start idle, and the items arrive once all of them are polling.
    if connection.vendor == "postgresql":
        items = enqueue_many(specs)
        procs = _behind_a_gate(lambda: start("--burst"))
    else:
        procs = start()
        wait_for(lambda: Worker.objects.filter(status="running").count() == 8, timeout=120)
        items = enqueue_many(specs)
        wait_for(lambda: WorkItem.objects.completed().count() == 2000, timeout=120)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        _out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    runs = Counter(line.split()[0] for line in record.read_text().splitlines())
    assert set(runs) == {item.pk for item in items}
    assert max(runs.values()) == 1, "an item's handler ran twice"
    assert WorkItem.objects.completed().count() == 2000
    assert set(WorkItem.objects.values_list("lease_token", flat=True)) == {1}
    workers = {line.split()[3] for line in record.read_text().splitlines()}
    assert len(workers) >= 2


def _behind_a_gate(start: Callable[[], list[subprocess.Popen[str]]]) -> list[subprocess.Popen[str]]:
    """PostgreSQL: start processes while `work_items` refuses writes; open it once all wait."""
    import psycopg

    from tests.conftest import database_url

    gate = psycopg.connect(database_url())
    try:
        gate.execute("LOCK TABLE work_items IN EXCLUSIVE MODE")
        procs = start()
        deadline = time.monotonic() + 120
        while True:
            # Activity is read once per transaction unless the snapshot is cleared.
            gate.execute("SELECT pg_stat_clear_snapshot()")
            row = gate.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            ).fetchone()
            if row is not None and row[0] >= len(procs):
                return procs
            assert time.monotonic() < deadline, "the processes never reached their first claim"
            assert all(proc.poll() is None for proc in procs), "a process exited before its claim"
            time.sleep(0.05)
    finally:
        gate.commit()
        gate.close()


@pytest.mark.postgres
def test_a_deadlocked_complete_and_acquire_changes_nothing_and_runs_again(make_items):
    """A real lock cycle: PostgreSQL aborts the statement, which leaves no trace.

    The worker runs such a statement again (tests/test_worker.py); this shows
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
    from tests.conftest import database_url

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

    from tests.conftest import database_url

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
