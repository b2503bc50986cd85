"""leasing.testing: the assertions on what was enqueued, run_handler(), run_item(),
override_handler(), the pytest fixture and the TestCase mixin (drain(): test_testing_drain.py).

Each runs in pytest-django's `db` (the test's transaction) on both databases;
tests/db/test_testing_drain.py also runs the helpers outside a transaction.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import TestCase
from django.utils import timezone

from leasing import (
    InvalidInput,
    PermanentError,
    UnknownWorkType,
    WorkContext,
    apply_action,
    create_checkpoint,
    enqueue,
    enqueue_many,
    pause,
)
from leasing.exceptions import InvalidStatus, PayloadNotSerializable
from leasing.handlers import registry
from leasing.models import WorkItem
from leasing.testing import (
    COMPLETED,
    FAILED,
    LOST,
    RETRIED,
    HandlerRun,
    LeasingTestMixin,
    NotClaimable,
    assert_enqueued,
    drain,
    enqueued,
    override_handler,
    refute_enqueued,
    run_handler,
    run_item,
)

pytest_plugins = ["leasing.testing.pytest"]

pytestmark = pytest.mark.django_db


# --- what was enqueued -------------------------------------------------------------------


def _three() -> list[WorkItem]:
    return enqueue_many(
        [
            {"task_id": "t1", "work_type": "test.echo", "input_data": {"user": {"id": 1}, "n": 1}},
            {
                "task_id": "t2",
                "work_type": "test.echo",
                "input_data": {"user": {"id": 2}},
                "queue_name": "mail",
                "priority": 5,
                "unique_key": "echo-2",
            },
            {"task_id": "t3", "work_type": "test.noop"},
        ]
    )


def test_assert_enqueued_matches_by_each_filter_and_returns_the_items_in_claim_order() -> None:
    first, second, third = _three()

    assert assert_enqueued("test.echo") == [second, first]  # priority 5 claims first
    assert assert_enqueued(task_id="t3") == [third]
    assert assert_enqueued(queue_name="mail") == [second]
    assert assert_enqueued(unique_key="echo-2") == [second]
    assert assert_enqueued(priority=5) == [second]
    assert assert_enqueued("test.echo", input_data={"user": {"id": 1}}) == [first]
    assert assert_enqueued("test.echo", count=2) == [second, first]


def test_input_data_matches_a_subset_of_dicts_and_anything_else_by_equality() -> None:
    nested, listed, scalar = enqueue_many(
        [
            {
                "task_id": "n",
                "work_type": "test.echo",
                "input_data": {"a": {"b": 1, "c": 2}, "d": 3},
            },
            {"task_id": "l", "work_type": "test.echo", "input_data": [1, 2, 3]},
            {"task_id": "s", "work_type": "test.echo", "input_data": 7},
        ]
    )

    assert enqueued(input_data={"a": {"b": 1}}) == [nested]
    assert enqueued(input_data={"a": {"b": 2}}) == []
    assert enqueued(input_data={"x": None}) == []
    assert enqueued(input_data=[1, 2, 3]) == [listed]
    assert enqueued(input_data=[1, 2]) == []
    assert enqueued(input_data=7) == [scalar]


def test_assert_enqueued_fails_naming_what_it_looked_for_and_what_there_is() -> None:
    _three()

    with pytest.raises(AssertionError) as failure:
        assert_enqueued("test.echo", input_data={"user": {"id": 9}})

    message = str(failure.value)
    assert "pending work item with work_type='test.echo'" in message
    assert "input_data containing {'user': {'id': 9}}" in message
    assert "none matched" in message
    # the items of that work type, so the difference shows
    assert "task_id='t1'" in message
    assert "{'id': 1}" in message
    assert "input_data={'user': {'id': 2}}" in message
    assert "test.noop" not in message


def test_assert_enqueued_with_nothing_at_all_says_so() -> None:
    with pytest.raises(AssertionError, match="There are no pending work items at all"):
        assert_enqueued("test.echo")


def test_assert_enqueued_with_a_count_fails_listing_the_matches() -> None:
    _three()

    with pytest.raises(AssertionError, match=r"Expected exactly 1 .*; 2 matched") as failure:
        assert_enqueued("test.echo", count=1)
    assert "task_id='t1'" in str(failure.value)
    assert "task_id='t2'" in str(failure.value)
    with pytest.raises(AssertionError, match=r"Expected 3 pending work items .*; 2 matched"):
        assert_enqueued("test.echo", count=3)
    with pytest.raises(TypeError):
        assert_enqueued("test.echo", count=-1)


def test_refute_enqueued_passes_when_nothing_matches_and_fails_listing_what_does() -> None:
    _three()

    refute_enqueued("test.echo", input_data={"user": {"id": 3}})
    refute_enqueued("test.sleep")
    with pytest.raises(AssertionError) as failure:
        refute_enqueued("test.echo", queue_name="mail")
    message = str(failure.value)
    assert "Expected no pending work item with work_type='test.echo', queue_name='mail'" in message
    assert "1 matched" in message
    assert "unique_key='echo-2'" in message


def test_only_pending_items_count_unless_a_status_is_given() -> None:
    run_handler("test.echo", {"done": True})
    waiting = enqueue("t-wait", "test.echo", {"done": False})

    assert enqueued("test.echo") == [waiting]
    refute_enqueued("test.echo", input_data={"done": True})
    assert len(assert_enqueued("test.echo", status="completed")) == 1
    assert len(enqueued("test.echo", status=None)) == 2
    assert len(enqueued("test.echo", status=["pending", "completed"])) == 2


def test_scheduled_tells_items_due_later_from_items_due_now() -> None:
    later = enqueue("t-later", "test.echo", run_after=timezone.now() + timedelta(hours=1))
    now = enqueue("t-now", "test.echo")

    assert assert_enqueued(scheduled=True) == [later]
    assert assert_enqueued(scheduled=False) == [now]
    with pytest.raises(AssertionError, match="scheduled for later"):
        assert_enqueued("test.noop", scheduled=True)


# --- run_handler -------------------------------------------------------------------------


def test_run_handler_runs_the_handler_on_a_real_claimed_lease_and_completes_the_item() -> None:
    run = run_handler("test.echo", {"hello": "world"})

    assert isinstance(run, HandlerRun)
    assert run.outcome == COMPLETED
    assert run.output == {"echo": {"hello": "world"}, "attempt": 1}
    assert run.attempt == 1
    assert run.error is None
    assert run.lease.token == 1
    assert run.lease.worker_id == "leasing.testing"
    assert run.item.pk == run.lease.work_item_id
    assert run.item.status == "completed"
    assert run.item.output_data == run.output


def test_run_handler_checkpoints_are_fenced_writes_and_resume_state_reads_them() -> None:
    # A crashed earlier attempt of the task left its progress: the handler resumes from it.
    create_checkpoint("import-7", "iteration_end", {"i": 3})

    run = run_handler("test.resumable", {"n": 5}, task_id="import-7")

    assert run.outcome == COMPLETED
    assert [c.snapshot_data for c in run.checkpoints] == [{"i": 4}, {"i": 5}]
    assert run.output == {"resumed_at": {"i": 5}, "attempt": 1}


def test_run_handler_raises_the_handlers_error_after_writing_its_retry() -> None:
    with pytest.raises(ValueError, match="this always fails"):
        run_handler("test.always_fail", task_id="fails")

    (item,) = assert_enqueued("test.always_fail", task_id="fails", scheduled=True)
    assert item.retry_count == 1
    assert item.error_message == "ValueError: this always fails"
    boundary = item.checkpoints.get(checkpoint_type="error_boundary")
    assert boundary.snapshot_data["will_retry"] is True


def test_run_handler_without_raising_returns_the_retry_or_the_failure() -> None:
    retried = run_handler("test.always_fail", raise_errors=False)
    failed = run_handler("test.permanent", raise_errors=False)
    last = run_handler("test.always_fail", max_retries=0, raise_errors=False)

    assert (retried.outcome, retried.item.status) == (RETRIED, "pending")
    assert isinstance(retried.error, ValueError)
    assert (failed.outcome, failed.item.status) == (FAILED, "failed")
    assert isinstance(failed.error, PermanentError)
    assert (last.outcome, last.item.status) == (FAILED, "failed")
    assert [c.checkpoint_type for c in last.checkpoints] == ["error_boundary"]


def test_an_output_that_cannot_be_stored_fails_the_item_as_a_worker_would() -> None:
    run = run_handler("test.bad_output", raise_errors=False)

    assert run.outcome == FAILED
    assert isinstance(run.error, PayloadNotSerializable)
    assert run.item.status == "failed"


def test_run_handler_refuses_an_unregistered_work_type_and_enqueues_nothing() -> None:
    with pytest.raises(UnknownWorkType, match=r"nobody\.handles\.this"):
        run_handler("nobody.handles.this")
    assert enqueued(status=None) == []


def test_bad_arguments_raise_clear_errors_and_write_nothing() -> None:
    with pytest.raises(PayloadNotSerializable):
        run_handler("test.echo", {"not json": object()})
    with pytest.raises(UnknownWorkType):
        drain(work_type="nobody.handles.this")
    with pytest.raises(InvalidStatus):
        enqueued(status="bogus")
    with pytest.raises(TypeError, match="scheduled"):
        enqueued(scheduled="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        run_item("")
    assert enqueued(status=None) == []


def test_run_once_in_a_handler_runs_its_side_effect_once_per_key() -> None:
    effects: list[int] = []

    def pay(ctx: WorkContext) -> Any:
        return ctx.run_once("pay:7", {"amount": 3}, lambda: effects.append(1) or len(effects))

    with override_handler("test.pay", pay):
        first = run_handler("test.pay")
        second = run_handler("test.pay")

    assert effects == [1]
    assert first.output == second.output == 1


def test_beat_mode_handlers_extend_their_lease_when_they_beat(leasing_settings: Any) -> None:
    leasing_settings(EXTENDER_INTERVAL=0.01)

    def beating(ctx: WorkContext) -> Any:
        import time

        before = WorkItem.objects.get(pk=ctx.lease.work_item_id)
        time.sleep(0.05)
        ctx.beat()  # past the interval: the extender renews the lease, recording progress
        after = WorkItem.objects.get(pk=ctx.lease.work_item_id)
        return {
            "progress_before": before.progress_at is not None,
            "progress_after": after.progress_at is not None,
            "extended": after.lease_expires_at > ctx.lease.expires_at,
        }

    with override_handler("test.beating", beating, heartbeat="beat", lease_duration=60):
        run = run_handler("test.beating")

    assert run.output == {"progress_before": False, "progress_after": True, "extended": True}


def test_a_run_whose_lease_moved_on_writes_nothing() -> None:
    def released_meanwhile(ctx: WorkContext) -> Any:
        apply_action(
            "force_release",
            ctx.lease.work_item_id,
            expected_token=None,
            actor="test",
            reason="an operator took it back",
        )
        return {"finished": True}

    with override_handler("test.released", released_meanwhile):
        run = run_handler("test.released")

    assert run.outcome == LOST
    assert run.output == {"finished": True}
    assert run.item.status == "pending"
    assert run.item.output_data is None


def test_a_run_past_its_deadline_is_timed_out_when_it_returns() -> None:
    def slow(ctx: WorkContext) -> Any:
        import time

        time.sleep(0.3)
        return {"late": True}

    with override_handler("test.slow", slow, timeout=0.1, max_retries=0):
        run = run_handler("test.slow")

    assert run.timed_out
    assert run.outcome == FAILED
    assert run.item.error_message.startswith("Timed out after")


# --- run_item ----------------------------------------------------------------------------


def test_run_item_runs_an_item_the_code_under_test_enqueued() -> None:
    item = enqueue("order-1", "test.echo", {"order": 1})

    run = run_item(item)

    assert run.item.pk == item.pk
    assert run.output == {"echo": {"order": 1}, "attempt": 1}
    assert run_item(enqueue("order-2", "test.echo")).item.status == "completed"


def test_run_item_says_why_an_item_cannot_be_claimed() -> None:
    done = run_handler("test.echo").item
    later = enqueue("later", "test.echo", run_after=timezone.now() + timedelta(hours=1))
    first, blocked = enqueue_many(
        [
            {"task_id": "chain", "work_type": "test.echo"},
            {"task_id": "chain-2", "work_type": "test.echo", "depends_on": [0]},
        ]
    )
    second_of_task = enqueue("chain", "test.echo")
    mail = enqueue("mail-1", "test.echo", queue_name="mail")
    pause(queue="mail", by="test", reason="maintenance")

    cases = [
        (done, "it is completed"),
        (later, "it is scheduled for"),
        (blocked, f"it waits on dependencies that have not completed: {first.pk} (pending)"),
        (second_of_task, f"{first.pk} (the same task, work type and queue) comes first"),
        (mail, "the queue 'mail' is paused (by test: maintenance)"),
        ("01NOSUCHITEM", "There is no work item '01NOSUCHITEM'"),
    ]
    for item, reason in cases:
        with pytest.raises(NotClaimable, match=re.escape(reason)):
            run_item(item)
    assert issubclass(NotClaimable, AssertionError)
    # The earlier item handed back by the refused run is pending as before.
    assert WorkItem.objects.get(pk=first.pk).status == "pending"


# --- override_handler --------------------------------------------------------------------


def test_override_handler_replaces_a_handler_inside_the_block_only() -> None:
    with override_handler("test.echo", lambda ctx: {"stub": True}, max_retries=0) as spec:
        assert spec.max_retries == 0
        assert run_handler("test.echo").output == {"stub": True}
    assert run_handler("test.echo", 1).output == {"echo": 1, "attempt": 1}

    with override_handler("test.brand_new", lambda ctx: "new"):
        assert run_handler("test.brand_new").output == "new"
    with pytest.raises(UnknownWorkType):
        run_handler("test.brand_new")


# --- the pytest fixture and the TestCase mixin -------------------------------------------


def test_the_leasing_worker_fixture_bundles_the_helpers(leasing_worker: Any) -> None:
    leasing_worker.override_handler("test.fixture_only", lambda ctx: ctx.input * 2)
    enqueue("t", "test.fixture_only", 21)

    (item,) = leasing_worker.assert_enqueued("test.fixture_only", input_data=21)
    result = leasing_worker.drain()

    assert result.completed[0].pk == item.pk
    assert result.completed[0].output_data == 42
    leasing_worker.refute_enqueued("test.fixture_only")
    assert leasing_worker.run_handler("test.fixture_only", 2).output == 4
    leasing_worker.close()  # what the fixture does after the test
    with pytest.raises(UnknownWorkType):
        leasing_worker.run_handler("test.fixture_only", 2)


class MixinTests(LeasingTestMixin, TestCase):
    def test_the_mixin_asserts_runs_and_drains(self) -> None:
        self.override_handler("test.mixin_only", lambda ctx: "ran")
        enqueue("m1", "test.mixin_only")

        self.assertEnqueued("test.mixin_only", task_id="m1")
        self.assertNotEnqueued("test.mixin_only", task_id="m2")
        with self.assertRaises(AssertionError):
            self.assertEnqueued("test.mixin_only", task_id="m2")
        self.assertEqual(self.drain().counts[COMPLETED], 1)
        self.assertEqual(self.run_handler("test.mixin_only").output, "ran")
        self.assertEqual(self.enqueued("test.mixin_only"), [])

    def test_the_mixins_handler_overrides_end_with_the_test(self) -> None:
        self.override_handler("test.mixin_only", lambda ctx: "ran")
        self.assertIn("test.mixin_only", registry)
        self.doCleanups()  # what unittest does after the test
        self.assertNotIn("test.mixin_only", registry)
