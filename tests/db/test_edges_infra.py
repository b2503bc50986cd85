"""The database's trouble never costs an item an attempt, and the smaller defects users hit.

* a connection the server dropped while idle is replaced before a handler gets it;
* a handler cut short by a lost connection or a lock timeout is handed back
  without counting a retry (after 5 in a row it counts, so it cannot loop);
* a worker id of a stopped process can be reused, a live one cannot;
* a freed slot wakes the dispatcher whatever the outcome;
* a process is lost after 3 of its own heartbeat intervals, whatever the sweep's;
* an outage met outside a statement (at a COMMIT), or a driver that lost track of
  the server's answers, is an outage: never a failed item, never a worker's exit.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from leasing import RecoverySweep, enqueue, enqueue_many
from leasing.models import Checkpoint, Worker, WorkItem
from leasing.services import processes
from leasing.worker import WorkerOptions, WorkerRuntime
from tests.support.helpers import database_now, recorded
from tests.support.workers import FAST_POLL, parse_summary

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fast_poll(leasing_settings):
    leasing_settings(**FAST_POLL)


def runworker(*args: str) -> dict:
    out = StringIO()
    call_command("runworker", *args, stdout=out)
    return parse_summary(out.getvalue())


@pytest.mark.postgres
def test_a_handler_that_loses_its_connection_is_handed_back_until_it_has_done_so_5_times(
    tmp_path, monkeypatch, leasing_settings
):
    leasing_settings(RETRY_BACKOFF_BASE=0.01)
    monkeypatch.setenv("LEASING_TEST_RECORD", str(tmp_path / "runs.txt"))
    item = enqueue("cut", "test.kill_own_connection", max_retries=1)
    summary = WorkerRuntime(WorkerOptions(burst=True, poll_interval=0.05)).run()
    row = WorkItem.objects.get(pk=item.pk)
    runs = recorded(tmp_path / "runs.txt", "ran")
    # 4 interruptions hand it back free; the 5th counts as the first retry; the
    # next 4 are free again; the 10th uses the last retry and fails it.
    assert len(runs) == 10
    assert row.status == "failed" and row.retry_count == 1
    assert "5 interruptions in a row" in row.error_message
    reasons = [
        c.snapshot_data["reason"]
        for c in Checkpoint.objects.filter(task_id="cut").order_by("sequence_number")
    ]
    assert reasons == ["interrupted"] * 10
    assert summary.interrupted == 8 and summary.failed == 1 and summary.retried == 1


def test_a_lock_timeout_in_a_handler_is_not_an_item_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("LEASING_TEST_RECORD", str(tmp_path / "runs.txt"))
    item = enqueue("locked", "test.locked_once", max_retries=0)
    WorkerRuntime(WorkerOptions(burst=True, poll_interval=0.05)).run()
    row = WorkItem.objects.get(pk=item.pk)
    assert row.status == "completed" and row.retry_count == 0
    assert row.output_data == {"interruptions_before": 1}
    assert row.interruptions == 0  # reset once the item completed
    assert len(recorded(tmp_path / "runs.txt", "ran")) == 2


def test_a_burst_worker_writes_its_results_before_it_exits_despite_lock_timeouts(monkeypatch):
    from django.db import OperationalError

    from leasing.worker import dispatcher as runtime

    real = runtime.complete
    failures = {"left": 3}

    def locked_at_first(manager, done):
        if done and failures["left"]:
            failures["left"] -= 1
            # What Django raises when SQLite's busy wait runs out.
            raise OperationalError("database is locked") from sqlite3.OperationalError(
                "database is locked"
            )
        return real(manager, done)

    monkeypatch.setattr(runtime, "complete", locked_at_first)
    monkeypatch.setattr(
        runtime,
        "complete_and_claim",
        lambda manager, done, n, terms, filters: (
            locked_at_first(manager, done),
            manager.claim(n, terms, filters),
        ),
    )
    items = enqueue_many([{"task_id": f"t{i}", "work_type": "test.echo"} for i in range(5)])
    summary = WorkerRuntime(WorkerOptions(concurrency=2, burst=True, poll_interval=0.05)).run()
    assert failures["left"] == 0
    assert summary.reason == "burst-done" and summary.completed == 5
    rows = WorkItem.objects.filter(pk__in=[i.pk for i in items])
    assert set(rows.values_list("status", flat=True)) == {"completed"}


def test_a_worker_id_can_be_reused_once_its_process_stopped_but_not_while_it_lives():
    enqueue("t", "test.echo")
    first = runworker("--burst", "--worker-id", "fixed-id")
    assert first["completed"] == 1
    enqueue("t2", "test.echo")
    again = runworker("--burst", "--worker-id", "fixed-id")  # stopped: taken over
    assert again["completed"] == 1
    row = Worker.objects.get(pk="fixed-id")
    assert (row.status, row.items_completed) == ("stopped", 2)
    # A live process holds the id (it beat a moment ago).
    Worker.objects.filter(pk="fixed-id").update(status="running", last_seen_at=database_now())
    with pytest.raises(CommandError, match="still running"):
        runworker("--burst", "--worker-id", "fixed-id")


def test_a_freed_slot_wakes_the_dispatcher_whatever_the_outcome(leasing_settings):
    leasing_settings(POLL_INTERVAL=1.0)
    enqueue_many(
        [{"task_id": f"f{i}", "work_type": "test.always_fail", "max_retries": 0} for i in range(5)]
    )
    started = time.monotonic()
    summary = runworker("--burst", "--concurrency", "1")
    elapsed = time.monotonic() - started
    assert summary["failed"] == 5
    # Before the fix, each failed item waited for a poll interval.
    assert elapsed < 2.5, elapsed


def test_a_process_is_lost_after_three_of_its_own_intervals_not_the_sweeps():
    processes.register("slow-beater", heartbeat_interval=2.0)
    processes.register("fast-beater", heartbeat_interval=0.1)
    seen = database_now() - timedelta(seconds=1)
    Worker.objects.filter(pk__in=["slow-beater", "fast-beater"]).update(last_seen_at=seen)
    # A sweep far more frequent than the slow beater's heartbeat.
    stats = RecoverySweep(scan_interval_seconds=0.05).scan_and_recover()
    assert stats.workers_lost == 1
    statuses = dict(Worker.objects.values_list("worker_id", "status"))
    assert statuses["slow-beater"] == "running"  # 1 s silent < 3 x 2 s
    assert statuses["fast-beater"] == "lost"  # 1 s silent > 3 x 0.1 s


def _garbled_commit() -> Exception:
    """What psycopg raised in a fault run after pgbouncer's server connection crashed:
    an `InternalError` with no SQLSTATE, from the driver, not the server."""
    import psycopg
    from django.db.utils import InternalError

    error = InternalError("received 2 results from command 'COMMIT'")
    error.__cause__ = psycopg.InternalError("received 2 results from command 'COMMIT'")
    return error


@pytest.mark.postgres
def test_a_garbled_answer_while_completing_costs_the_item_nothing(monkeypatch):
    """A parent (an item others depend on) completes in a transaction of its own; when
    the driver loses track of its COMMIT, the completion is written again later: the
    item completes, no attempt is counted, and the worker goes on."""
    from leasing.services import completion

    real = completion.finish_with_dependents
    garbled = {"left": 2}

    def garbled_at_first(using, statement):
        if garbled["left"]:
            garbled["left"] -= 1
            raise _garbled_commit()
        return real(using, statement)

    monkeypatch.setattr(completion, "finish_with_dependents", garbled_at_first)
    parent = enqueue("parent", "test.echo", max_retries=0)
    child = enqueue("child", "test.echo", depends_on=[parent.pk])
    summary = WorkerRuntime(WorkerOptions(concurrency=2, burst=True, poll_interval=0.05)).run()
    assert garbled["left"] == 0
    assert summary.reason == "burst-done"
    row = WorkItem.objects.get(pk=parent.pk)
    assert (row.status, row.retry_count, row.error_message) == ("completed", 0, None)
    assert WorkItem.objects.get(pk=child.pk).status == "completed"


@pytest.mark.postgres
def test_a_refused_output_whose_lease_moved_on_is_lost_not_fatal(monkeypatch):
    """The row-by-row completion meets a value the database refuses, and by then the
    item belongs to another run: the worker counts the lease lost and goes on (it
    used to exit 1 on the LeaseLostError of the failure it tried to write)."""
    from django.db import connection

    from leasing.services import completion

    real = completion.finish_with_dependents
    refused = {"left": 1}

    def taken_over_then_refused(using, statement):
        if refused["left"]:
            refused["left"] -= 1
            with connection.cursor() as cursor:  # another worker's claim, after the sweep
                cursor.execute(
                    "UPDATE work_items SET lease_token = lease_token + 1, "
                    "lease_holder = 'elsewhere' WHERE task_id = 'parent'"
                )
                cursor.execute("SELECT '{bad'::jsonb")  # a DataError from the server
        return real(using, statement)

    monkeypatch.setattr(completion, "finish_with_dependents", taken_over_then_refused)
    parent = enqueue("parent", "test.echo", max_retries=0)
    enqueue("child", "test.echo", depends_on=[parent.pk])
    other = enqueue("other", "test.echo")
    summary = WorkerRuntime(WorkerOptions(concurrency=2, burst=True, poll_interval=0.05)).run()
    assert refused["left"] == 0
    assert summary.reason == "burst-done" and summary.lost == 1 and summary.failed == 0
    row = WorkItem.objects.get(pk=parent.pk)
    assert (row.status, row.lease_holder, row.retry_count) == ("in_progress", "elsewhere", 0)
    assert WorkItem.objects.get(pk=other.pk).status == "completed"


def test_a_garbled_answer_is_an_outage_and_a_server_error_is_not():
    import psycopg
    from django.db.utils import DataError, InternalError

    from leasing.sql.runner import is_infrastructure_error

    assert is_infrastructure_error(_garbled_commit())
    # The server's own internal error (SQLSTATE XX000) is the statement's, not an outage.
    server = InternalError("cache lookup failed")
    server.__cause__ = psycopg.errors.lookup("XX000")("cache lookup failed")
    assert not is_infrastructure_error(server)
    refused = DataError("invalid input syntax for type json")
    refused.__cause__ = psycopg.errors.lookup("22P02")("invalid input syntax for type json")
    assert not is_infrastructure_error(refused)


@pytest.mark.postgres
def test_a_connection_lost_at_a_commit_outside_a_statement_does_not_stop_the_worker(
    monkeypatch,
):
    """An outage the statements' own translation did not see (say at the COMMIT of a
    transaction) reaches the worker's loop as Django's `OperationalError`: it
    reconnects and goes on, as for any outage."""
    import psycopg
    from django.db.utils import OperationalError

    from leasing.worker import dispatcher

    real = dispatcher.complete_and_claim
    dropped = {"left": 2}

    def dropped_at_first(manager, done, n, terms, filters):
        if done and dropped["left"]:
            dropped["left"] -= 1
            error = OperationalError("consuming input failed: server closed the connection")
            error.__cause__ = psycopg.OperationalError("server closed the connection")
            raise error
        return real(manager, done, n, terms, filters)

    monkeypatch.setattr(dispatcher, "complete_and_claim", dropped_at_first)
    items = enqueue_many([{"task_id": f"t{i}", "work_type": "test.echo"} for i in range(30)])
    summary = WorkerRuntime(
        WorkerOptions(concurrency=2, burst=True, poll_interval=0.05, prefetch=4)
    ).run()
    assert dropped["left"] == 0
    assert summary.reason == "burst-done" and summary.completed == 30
    rows = WorkItem.objects.filter(pk__in=[i.pk for i in items])
    assert set(rows.values_list("status", flat=True)) == {"completed"}
    assert set(rows.values_list("retry_count", flat=True)) == {0}
