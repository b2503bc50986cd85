"""The worker runtime and `runworker`, on SQLite and PostgreSQL."""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from leasing import enqueue, enqueue_many
from leasing.management.commands.runworker import YOUNG_GENERATION_THRESHOLD
from leasing.models import Checkpoint, Worker, WorkItem
from leasing.worker import WorkerOptions, WorkerRuntime
from tests.support.helpers import raise_deadlock
from tests.support.workers import FAST_POLL, parse_summary

pytestmark = pytest.mark.django_db(transaction=True)


def runworker(*args: str) -> dict:
    out = StringIO()
    call_command("runworker", *args, stdout=out)
    return parse_summary(out.getvalue())


@pytest.fixture(autouse=True)
def fast_worker(leasing_settings):
    leasing_settings(RETRY_BACKOFF_BASE=0.01, **FAST_POLL)


def test_runworker_collects_the_young_generation_less_often():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        runworker("--burst")
        assert gc.get_threshold() == (YOUNG_GENERATION_THRESHOLD, 10, 10)
        assert YOUNG_GENERATION_THRESHOLD > 700
    finally:
        gc.set_threshold(*before)


def test_burst_drains_a_mixed_queue(leasing_settings):
    enqueue_many(
        [
            {"task_id": "a", "work_type": "test.echo", "input_data": {"n": 1}},
            {"task_id": "b", "work_type": "test.echo", "input_data": {"n": 2}},
            {"task_id": "c", "work_type": "test.fail_then_succeed", "input_data": {"failures": 2}},
            {"task_id": "d", "work_type": "test.always_fail", "max_retries": 2},
            {"task_id": "e", "work_type": "test.permanent", "max_retries": 5},
            {"task_id": "f", "work_type": "nobody.handles.this"},
        ]
    )
    summary = runworker("--burst", "--concurrency", "2")

    by_task = {item.task_id: item for item in WorkItem.objects.all()}
    assert by_task["a"].status == "completed"
    assert by_task["a"].output_data == {"echo": {"n": 1}, "attempt": 1}
    assert by_task["b"].output_data["echo"] == {"n": 2}
    assert by_task["c"].status == "completed"
    assert by_task["c"].retry_count == 2
    assert by_task["c"].output_data == {"attempt": 3}
    assert by_task["d"].status == "failed"
    assert by_task["d"].retry_count == 2
    assert by_task["d"].error_message == "ValueError: this always fails"
    assert by_task["e"].status == "failed"
    assert by_task["e"].retry_count == 0  # PermanentError: no retry
    # Nobody here can run it, so nobody claimed it.
    assert by_task["f"].status == "pending"
    assert by_task["f"].lease_token == 0

    # Each failed attempt left an error_boundary checkpoint with its traceback.
    boundaries = Checkpoint.objects.filter(task_id="d", checkpoint_type="error_boundary")
    assert boundaries.count() == 3
    first = boundaries.order_by("sequence_number").first().snapshot_data
    assert first["exception_class_path"] == "builtins.ValueError"
    assert "Traceback" in first["traceback"]
    assert first["will_retry"] is True and first["attempt"] == 1

    assert summary["completed"] == 3
    assert summary["failed"] == 2
    assert summary["retried"] == 4
    assert summary["reason"] == "burst-done"
    row = Worker.objects.get(worker_id=summary["worker_id"])
    assert row.status == "stopped" and row.stopped_at is not None
    assert (row.items_completed, row.items_failed) == (3, 2)
    assert row.work_types == sorted(row.work_types) and "test.echo" in row.work_types


def test_a_deadlocked_claim_and_complete_statement_is_run_again(
    monkeypatch, caplog, leasing_settings
):
    from leasing.worker import dispatcher as runtime

    real = runtime.complete_and_claim
    aborted = []

    def deadlock_once(manager, done, *args, **kwargs):
        if done and not aborted:
            # What PostgreSQL does to one side of a deadlock: the whole
            # statement is rolled back and Django raises OperationalError.
            aborted.append([lease.work_item_id for lease, _ in done])
            raise_deadlock()
        return real(manager, done, *args, **kwargs)

    monkeypatch.setattr(runtime, "complete_and_claim", deadlock_once)
    enqueue_many([{"task_id": f"t{i}", "work_type": "test.echo"} for i in range(20)])
    leasing_settings(PREFETCH=2)
    with caplog.at_level("WARNING", logger="leasing.worker"):
        summary = runworker("--burst", "--concurrency", "2")

    assert aborted, "the injected deadlock never happened"
    assert summary["completed"] == 20 and summary["reason"] == "burst-done"
    rows = list(WorkItem.objects.values_list("status", "lease_token"))
    assert rows == [("completed", 1)] * 20  # each ran and was claimed exactly once
    assert "statement aborted (OperationalError: deadlock detected); retrying" in caplog.text


def test_a_database_error_that_is_not_a_lock_conflict_still_stops_the_worker(monkeypatch):
    from django.db import ProgrammingError

    from leasing.worker import dispatcher as runtime

    def broken(*args, **kwargs):
        raise ProgrammingError("relation does not exist")

    monkeypatch.setattr(runtime, "complete_and_claim", broken)
    enqueue("t", "test.echo")
    with pytest.raises(ProgrammingError):
        runworker("--burst")


def test_output_that_is_not_json_fails_the_item_without_retry():
    item = enqueue("t", "test.bad_output", max_retries=3)
    runworker("--burst")
    row = WorkItem.objects.get(pk=item.pk)
    assert row.status == "failed"
    assert row.retry_count == 0
    assert "not JSON-serializable" in row.error_message


def test_work_type_queue_and_task_filters():
    a = enqueue("t1", "test.echo", queue_name="mail")
    b = enqueue("t2", "test.echo", queue_name="default")
    c = enqueue("t3", "test.noop", queue_name="mail")
    runworker("--burst", "--queue", "mail", "--work-type", "test.echo")
    statuses = dict(WorkItem.objects.values_list("pk", "status"))
    assert statuses == {a.pk: "completed", b.pk: "pending", c.pk: "pending"}
    # A task filter is the embedding API's (runworker splits work by queue and type).
    WorkerRuntime(WorkerOptions(burst=True, task_id="t3")).run()
    assert WorkItem.objects.get(pk=c.pk).status == "completed"
    assert WorkItem.objects.get(pk=b.pk).status == "pending"


def test_max_items_stops_after_that_many_claims(leasing_settings):
    enqueue_many([{"task_id": f"t{i}", "work_type": "test.noop"} for i in range(5)])
    leasing_settings(PREFETCH=0)
    summary = runworker("--max-items", "2")
    assert summary["claimed"] == 2 and summary["reason"] == "max-items"
    assert WorkItem.objects.completed().count() == 2
    assert WorkItem.objects.pending().count() == 3


def test_slow_work_is_claimed_in_chunks_so_the_first_handlers_start_at_once():
    # 230 idle executors and 230 items: one claim of all of them would keep
    # every executor waiting for the last row; chunks of CLAIM_CHUNK start the
    # first handlers while the rest are claimed. Items claimed by one
    # statement share its lease_acquired_at (the statement's clock).
    from leasing.worker.dispatcher import CLAIM_CHUNK

    enqueue_many(
        [{"task_id": f"s{i}", "work_type": "test.sleep", "input_data": {"seconds": 0.3}}
         for i in range(230)]
    )  # fmt: skip
    summary = runworker("--burst", "--concurrency", "230")

    assert summary["completed"] == 230
    per_claim = Counter(WorkItem.objects.values_list("lease_acquired_at", flat=True))
    assert CLAIM_CHUNK == 100
    assert sorted(per_claim.values(), reverse=True) == [100, 100, 30]


def test_thread_mode_keeps_a_lease_five_times_longer_than_its_duration(leasing_settings):
    leasing_settings(LEASE_DURATION=1, HEARTBEAT_INTERVAL=0.25)
    item = enqueue("long", "test.sleep", input_data={"seconds": 5.0})
    seen_expired = threading.Event()
    stop = threading.Event()

    def watch() -> None:
        from django.db import connection

        try:
            while not stop.is_set():
                if WorkItem.objects.expired().filter(pk=item.pk).exists():
                    seen_expired.set()
                time.sleep(0.05)
        finally:
            connection.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        summary = runworker("--burst")
    finally:
        stop.set()
        watcher.join()
    row = WorkItem.objects.get(pk=item.pk)
    assert row.status == "completed"
    assert row.output_data == {"slept": True, "lease_lost": False}
    assert row.lease_token == 1  # claimed once
    assert row.completed_at - row.started_at >= timedelta(seconds=5)
    assert not seen_expired.is_set(), "the lease expired while the handler was running"
    assert summary["completed"] == 1 and summary["lost"] == 0


def test_beat_mode_keeps_the_lease_of_a_beating_handler(leasing_settings):
    leasing_settings(LEASE_DURATION=1, HEARTBEAT_INTERVAL=0.25)
    item = enqueue("beating", "test.beat_sleep", input_data={"seconds": 3.0, "every": 0.1})
    runworker("--burst")
    row = WorkItem.objects.get(pk=item.pk)
    assert row.status == "completed"
    assert row.output_data == {"lease_lost": False}
    assert row.progress_at is not None and row.progress_at > row.started_at


def test_beat_mode_lets_a_silent_handler_lose_its_lease(leasing_settings):
    from leasing import RecoverySweep

    leasing_settings(LEASE_DURATION=1, HEARTBEAT_INTERVAL=0.25)
    item = enqueue("stuck", "test.beat_sleep", input_data={"seconds": 2.5, "every": 0})
    sweeper = RecoverySweep(scan_interval_seconds=0.2, create_checkpoints=True)
    sweeper.start()
    try:
        summary = runworker("--max-items", "1")
    finally:
        sweeper.stop()
    row = WorkItem.objects.get(pk=item.pk)
    # The sweep took it back while the handler sat silent; its run was abandoned (nothing
    # it returned was written).
    assert row.status == "pending"
    assert row.retry_count == 1
    assert row.error_message.startswith("Lease expired - retry 1/")
    assert summary["lost"] == 1 and summary["completed"] == 0


def test_resumable_handler_resumes_from_its_last_checkpoint():
    item = enqueue("resume-task", "test.resumable", input_data={"n": 5, "crash_at": 3})
    runworker("--burst")
    row = WorkItem.objects.get(pk=item.pk)
    assert row.status == "completed" and row.retry_count == 1
    ends = list(
        Checkpoint.objects.filter(task_id="resume-task", checkpoint_type="iteration_end")
        .order_by("sequence_number")
        .values_list("snapshot_data", flat=True)
    )
    # Steps 1-3 ran once before the crash; the retry resumed at 3, not 0.
    assert [s["i"] for s in ends] == [1, 2, 3, 4, 5]
    assert row.output_data == {"resumed_at": {"i": 5}, "attempt": 2}


def test_worker_registers_itself_with_its_own_heartbeat(leasing_settings):
    leasing_settings(LEASE_DURATION=2, HEARTBEAT_INTERVAL=0.2)
    enqueue("t", "test.sleep", input_data={"seconds": 0.8})
    summary = runworker("--burst")
    row = Worker.objects.get(worker_id=summary["worker_id"])
    assert row.role == "worker"
    assert row.last_seen_at > row.started_at
    assert row.hostname and row.pid > 0
    assert summary["worker_id"].count(":") == 2  # hostname:pid:random


def test_each_start_gets_a_new_worker_id():
    first = WorkerRuntime(WorkerOptions(work_types=("test.noop",))).worker_id
    second = WorkerRuntime(WorkerOptions(work_types=("test.noop",))).worker_id
    assert first != second


def test_an_unknown_work_type_is_a_command_error():
    message = "No handler is registered for work type 'no.such.type'"
    with pytest.raises(CommandError, match=message):
        call_command("runworker", "--work-type", "no.such.type")


def test_a_heartbeat_not_below_the_lease_is_a_command_error(leasing_settings):
    leasing_settings(LEASE_DURATION=2, HEARTBEAT_INTERVAL=2)
    with pytest.raises(CommandError, match="must be below the lease"):
        call_command("runworker", "--burst")
    assert not Worker.objects.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", "0"],
        ["--concurrency", "many"],
        ["--max-items", "1.5"],
        ["--worker-id", " "],
    ],
)
def test_bad_options_are_rejected(args):
    with pytest.raises(CommandError):
        call_command("runworker", *args)
    assert not Worker.objects.exists()


def test_a_running_worker_logs_a_summary_every_summary_interval(caplog):
    enqueue("slow", "test.sleep", input_data={"seconds": 0.8})
    with caplog.at_level("INFO", logger="leasing.worker"):
        WorkerRuntime(WorkerOptions(burst=True, summary_interval=0.2)).run()
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("summary ")]
    assert len(summaries) >= 2, caplog.text
    assert "claimed 1, completed 0" in summaries[0]
