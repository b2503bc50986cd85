"""leasing.testing.drain(), and the helpers inside and outside a test's transaction.

Most tests run in pytest-django's `db` (one transaction, rolled back after
the test); the `transactional_db` ones run the same machinery in autocommit,
as a worker does. Both databases.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, ProgrammingError, connection
from django.utils import timezone

from leasing import (
    InvalidInput,
    PermanentError,
    WorkContext,
    apply_action,
    enqueue,
    enqueue_many,
    pause,
    resume,
)
from leasing.models import WorkItem
from leasing.testing import (
    FAILED,
    HANDED_BACK,
    RETRIED,
    BrokenTransaction,
    assert_enqueued,
    drain,
    override_handler,
    refute_enqueued,
    run_handler,
)
from leasing.testing import runs as runs_module


def _outcomes(result: Any) -> list[str]:
    return [run.outcome for run in result.runs]


# --- drain() ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_drain_runs_everything_claimable_in_claim_order_and_sums_it_up() -> None:
    low = enqueue("a", "test.echo", {"n": 1})
    high = enqueue("b", "test.echo", {"n": 2}, priority=5)
    bad = enqueue("c", "test.permanent")
    orphan = enqueue("d", "nobody.handles.this")  # no handler: no worker would claim it

    result = drain()

    assert [run.item.pk for run in result.runs] == [high.pk, low.pk, bad.pk]
    assert result.counts == {"completed": 2, "retried": 0, "failed": 1, "handed_back": 0, "lost": 0}
    assert [item.pk for item in result.completed] == [high.pk, low.pk]
    assert result.completed[0].output_data == {"echo": {"n": 2}, "attempt": 1}
    assert [item.status for item in result.failed] == ["failed"]
    ((item, error),) = result.errors
    assert item.pk == bad.pk and isinstance(error, PermanentError)
    assert len(result) == 3
    assert repr(result) == "<DrainResult completed=2 retried=0 failed=1 handed_back=0 lost=0>"
    assert assert_enqueued() == [orphan]
    assert drain().runs == ()


@pytest.mark.django_db
def test_drain_runs_only_the_queues_work_types_and_task_it_is_given() -> None:
    mail = enqueue("t1", "test.echo", queue_name="mail")
    other = enqueue("t2", "test.echo", queue_name="other")
    noop = enqueue("t3", "test.noop")
    task = enqueue("t4", "test.echo")

    assert [i.pk for i in drain(queue_name=["mail", "other"]).completed] == [mail.pk, other.pk]
    assert [i.pk for i in drain(work_type="test.noop").completed] == [noop.pk]
    assert [i.pk for i in drain(task_id="t4").completed] == [task.pk]
    refute_enqueued()


@pytest.mark.django_db
def test_drain_runs_items_as_their_dependencies_complete() -> None:
    parent, child = enqueue_many(
        [
            {"task_id": "parent", "work_type": "test.echo"},
            # First in claim order if it were claimable: it is not until its parent completes.
            {
                "task_id": "child",
                "work_type": "test.after_dependencies",
                "depends_on": [0],
                "priority": 10,
            },
        ]
    )

    result = drain()

    assert [run.item.pk for run in result.runs] == [parent.pk, child.pk]
    assert result.runs[1].output == {"unfinished_dependencies": 0}


@pytest.mark.django_db
def test_work_that_handlers_enqueue_runs_in_the_same_drain() -> None:
    def fan_out(ctx: WorkContext) -> Any:
        for index in range(ctx.input):
            enqueue(f"child-{index}", "test.echo", index)

    with override_handler("test.fan_out", fan_out):
        enqueue("root", "test.fan_out", 3)
        result = drain()

    assert result.counts["completed"] == 4
    assert sorted(item.output_data["echo"] for item in result.completed[1:]) == [0, 1, 2]


@pytest.mark.django_db
def test_a_retry_waits_for_its_backoff_until_scheduled_items_are_included() -> None:
    item = enqueue("flaky", "test.fail_then_succeed", {"failures": 1})

    first = drain()
    assert _outcomes(first) == [RETRIED]
    assert assert_enqueued(task_id="flaky", scheduled=True) == [item]
    assert drain().runs == ()

    second = drain(include_scheduled=True)
    assert second.completed[0].pk == item.pk
    assert second.runs[0].output == {"attempt": 2}


@pytest.mark.django_db
def test_retry_now_runs_each_retry_at_once_with_its_real_ending() -> None:
    flaky = enqueue("flaky", "test.fail_then_succeed", {"failures": 2})
    doomed = enqueue("doomed", "test.always_fail", max_retries=2)

    result = drain(retry_now=True, task_id="flaky")
    assert _outcomes(result) == [RETRIED, RETRIED, "completed"]
    assert [run.attempt for run in result.runs] == [1, 2, 3]
    assert result.completed[0].retry_count == 2
    assert result.runs[-1].output == {"attempt": 3}

    result = drain(retry_now=True, task_id="doomed")
    assert _outcomes(result) == [RETRIED, RETRIED, FAILED]
    assert result.failed[0].error_message == "ValueError: this always fails"
    boundaries = [c.snapshot_data for c in result.runs[-1].checkpoints]
    assert [b["attempt"] for b in boundaries] == [1, 2, 3]
    assert [b["will_retry"] for b in boundaries] == [True, True, False]
    assert {run.item.pk for run in result.runs} == {doomed.pk}
    assert flaky.pk not in {run.item.pk for run in result.runs}


@pytest.mark.django_db
def test_include_scheduled_runs_items_scheduled_for_later() -> None:
    later = enqueue("later", "test.echo", run_after=timezone.now() + timedelta(hours=1))

    assert drain().runs == ()
    assert [item.pk for item in drain(include_scheduled=True).completed] == [later.pk]


@pytest.mark.django_db
def test_a_database_interruption_hands_the_item_back_without_counting_a_retry() -> None:
    enqueue("locked", "test.locked_once")

    result = drain()

    assert _outcomes(result) == [HANDED_BACK, "completed"]
    assert result.handed_back[0].interruptions == 1
    assert result.completed[0].retry_count == 0
    assert result.runs[-1].output == {"interruptions_before": 1}


@pytest.mark.django_db
def test_a_run_whose_lease_was_taken_back_meanwhile_is_counted_lost() -> None:
    def taken_back(ctx: WorkContext) -> Any:
        apply_action(
            "force_release", ctx.lease.work_item_id, expected_token=None, actor="t", reason="r"
        )
        return {"done": True}

    with override_handler("test.taken_back", taken_back):
        enqueue("t", "test.taken_back")
        result = drain(max_runs=1)  # released each time, it would run again and again

    assert [(item.status, item.output_data) for item in result.lost] == [("pending", None)]


@pytest.mark.django_db
def test_drain_leaves_a_paused_queue_alone_until_it_resumes() -> None:
    mail = enqueue("m", "test.echo", queue_name="mail")
    pause(queue="mail", by="test", reason="maintenance")

    assert drain().runs == ()
    resume(queue="mail", by="test", reason="done")
    assert [item.pk for item in drain().completed] == [mail.pk]


@pytest.mark.django_db
def test_raise_errors_stops_the_drain_at_the_first_failure_once_its_ending_is_written() -> None:
    failing = enqueue("a", "test.always_fail")
    untouched = enqueue("b", "test.echo")

    with pytest.raises(ValueError, match="this always fails"):
        drain(raise_errors=True)

    assert WorkItem.objects.get(pk=failing.pk).retry_count == 1
    assert assert_enqueued("test.echo") == [untouched]


@pytest.mark.django_db
def test_max_runs_stops_early_and_a_runaway_drain_stops_with_an_error(monkeypatch: Any) -> None:
    enqueue_many([{"task_id": f"t{i}", "work_type": "test.echo"} for i in range(3)])
    assert len(drain(max_runs=2)) == 2
    assert len(assert_enqueued("test.echo")) == 1
    with pytest.raises(InvalidInput, match="max_runs"):
        drain(max_runs=0)

    monkeypatch.setattr(runs_module, "DRAIN_SAFETY_LIMIT", 5)

    def forever(ctx: WorkContext) -> None:
        enqueue("again", "test.forever")

    with override_handler("test.forever", forever):
        enqueue("again", "test.forever")
        with pytest.raises(AssertionError, match="ran 5 items and still finds work"):
            drain(work_type="test.forever")
    # The item claimed when it stopped was handed back, not left in progress.
    assert len(assert_enqueued("test.forever")) == 1


# --- inside and outside the test's transaction -------------------------------------------


def _create_twice(ctx: WorkContext) -> Any:
    User.objects.create(username=ctx.input)
    User.objects.create(username=ctx.input)  # IntegrityError: escapes the handler


def _create_twice_and_swallow(ctx: WorkContext) -> Any:
    User.objects.create(username=ctx.input)
    # Outside transaction.atomic(): inside a test's transaction this marks it broken.
    with contextlib.suppress(IntegrityError):
        User.objects.create(username=ctx.input)
    return {"ok": True}


@pytest.mark.django_db
def test_in_the_tests_transaction_a_handlers_database_error_leaves_it_usable() -> None:
    with override_handler("test.twice", _create_twice):
        run = run_handler("test.twice", "ada", raise_errors=False)

    assert run.outcome == RETRIED
    assert isinstance(run.error, IntegrityError)
    # The test goes on; the handler's writes were rolled back with its savepoint.
    assert not User.objects.filter(username="ada").exists()
    assert run.item.retry_count == 1


@pytest.mark.django_db
def test_a_handler_that_breaks_the_tests_transaction_without_raising_is_told_so() -> None:
    with override_handler("test.swallow", _create_twice_and_swallow):
        run = run_handler("test.swallow", "ada", raise_errors=False)

    assert run.outcome == RETRIED
    assert isinstance(run.error, BrokenTransaction)
    assert "transaction.atomic()" in str(run.error)
    assert User.objects.count() == 0


@pytest.mark.postgres
@pytest.mark.django_db
def test_an_aborted_postgresql_transaction_is_caught_though_django_did_not_flag_it() -> None:
    def query_a_missing_table(ctx: WorkContext) -> Any:
        # A raw cursor's error aborts PostgreSQL's transaction; Django sets no flag.
        with contextlib.suppress(ProgrammingError), connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")
        return {"ok": True}

    with override_handler("test.missing_table", query_a_missing_table):
        run = run_handler("test.missing_table", raise_errors=False)

    assert isinstance(run.error, BrokenTransaction)
    assert run.outcome == RETRIED
    assert WorkItem.objects.count() == 1  # the test's transaction still answers


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_a_handlers_writes_commit_as_in_production() -> None:
    with override_handler("test.twice", _create_twice):
        run = run_handler("test.twice", "ada", raise_errors=False)
    with override_handler("test.swallow", _create_twice_and_swallow):
        kept = run_handler("test.swallow", "grace", raise_errors=False)

    assert run.outcome == RETRIED
    assert kept.outcome == "completed"
    assert sorted(User.objects.values_list("username", flat=True)) == ["ada", "grace"]


@pytest.mark.django_db(transaction=True)
def test_drain_outside_a_transaction_runs_dependencies_and_retries() -> None:
    enqueue_many(
        [
            {"task_id": "flaky", "work_type": "test.fail_then_succeed", "input_data": {}},
            {"task_id": "after", "work_type": "test.after_dependencies", "depends_on": [0]},
        ]
    )

    result = drain(retry_now=True)

    assert _outcomes(result) == [RETRIED, "completed", "completed"]
    assert result.runs[-1].output == {"unfinished_dependencies": 0}
    refute_enqueued()
