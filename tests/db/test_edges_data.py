"""One bad row never fails a batch, and bad input never reaches the database.

Every text and JSON value is checked before it is written: lone surrogates
and NUL characters (PostgreSQL refuses both), text keys over 255 characters,
JSON nested deeper than 100 levels or over the size limit. What still fails
inside a batch statement is isolated: the rest of the batch commits.
"""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from leasing import LeaseManager, create_checkpoint, enqueue, enqueue_many, run_once
from leasing.exceptions import InvalidInput
from leasing.models import Checkpoint, IdempotencyKey, WorkItem
from leasing.worker import WorkerOptions, WorkerRuntime

pytestmark = pytest.mark.django_db(transaction=True)

SURROGATE = "bad \ud800 text"
DEEP: list = []
for _ in range(5000):
    DEEP = [DEEP]


def counts() -> tuple[int, int, int]:
    return WorkItem.objects.count(), Checkpoint.objects.count(), IdempotencyKey.objects.count()


def test_a_handler_output_that_cannot_be_stored_fails_only_its_item(leasing_settings):
    leasing_settings(RETRY_BACKOFF_BASE=0.01)
    good = enqueue_many([{"task_id": f"t{i}", "work_type": "test.echo"} for i in range(20)])
    bad = enqueue("bad", "test.surrogate_output")
    summary = WorkerRuntime(WorkerOptions(concurrency=4, burst=True, poll_interval=0.05)).run()
    assert summary.reason == "burst-done"
    assert WorkItem.objects.filter(pk__in=[i.pk for i in good], status="completed").count() == 20
    row = WorkItem.objects.get(pk=bad.pk)
    assert row.status == "failed" and row.retry_count == 0  # the same on every attempt
    assert "lone surrogate" in row.error_message


@pytest.mark.postgres
def test_a_row_the_database_refuses_inside_a_batch_is_isolated(monkeypatch):
    """Validation is bypassed here, so PostgreSQL's jsonb itself refuses the row."""
    from leasing import validation
    from leasing.worker import executors

    real = validation.payload

    def lets_surrogates_through(name, value, **kwargs):
        if value == {"s": SURROGATE}:
            return '{"s": "bad \\ud800 text"}'  # JSON text jsonb refuses
        return real(name, value, **kwargs)

    monkeypatch.setattr(executors.validation, "payload", lets_surrogates_through)
    good = enqueue_many([{"task_id": f"t{i}", "work_type": "test.echo"} for i in range(30)])
    bad = enqueue("bad", "test.surrogate_output", max_retries=3)
    summary = WorkerRuntime(
        WorkerOptions(concurrency=2, burst=True, poll_interval=0.05, prefetch=40)
    ).run()
    assert summary.reason == "burst-done"
    assert WorkItem.objects.filter(pk__in=[i.pk for i in good], status="completed").count() == 30
    row = WorkItem.objects.get(pk=bad.pk)
    assert row.status == "failed" and row.error_message.startswith("output not storable: ")
    boundary = Checkpoint.objects.get(task_id="bad")
    assert boundary.snapshot_data["reason"] == "output_not_storable"


def test_an_error_text_with_a_lone_surrogate_or_nul_is_stored_cleaned(make_items):
    items = make_items(2)
    manager = LeaseManager("w")
    manager.acquire_leases(2)
    manager.release_lease(items[0].pk, success=False, error=ValueError(SURROGATE))
    manager.release_lease(items[1].pk, success=False, error="nul \x00 here")
    first, second = (WorkItem.objects.get(pk=i.pk) for i in items)
    assert first.status == "failed" and "\\ud800" in first.error_message
    assert second.status == "failed" and second.error_message == "nul \\x00 here"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"task_id": "nul\x00"},
        {"task_id": SURROGATE},
        {"task_id": "t" * 10_000},
        {"queue_name": "q" * 9_000},
        {"work_type": "w\x00"},
        {"input_data": {"s": SURROGATE}},
        {"input_data": {"s": "nul \x00"}},
        {"input_data": DEEP},
    ],
)
def test_enqueue_refuses_unstorable_text_and_json(kwargs):
    args = {"task_id": "t", "work_type": "test.echo", **kwargs}
    with pytest.raises(InvalidInput):
        enqueue(**args)
    with pytest.raises(InvalidInput):
        enqueue_many([{"task_id": "ok", "work_type": "test.echo"}, args])
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize("snapshot", [{"s": SURROGATE}, {"s": "\x00"}, DEEP])
def test_checkpoints_refuse_unstorable_snapshots(make_items, snapshot):
    [item] = make_items(1)
    with pytest.raises(InvalidInput):
        create_checkpoint(item.task_id, "manual_checkpoint", snapshot)
    with pytest.raises(InvalidInput):
        create_checkpoint("t\ud800", "manual_checkpoint", {"ok": 1})
    assert Checkpoint.objects.count() == 0


@pytest.mark.parametrize(
    ("key", "request_", "response"),
    [
        (SURROGATE, {}, 1),
        ("k", {"s": SURROGATE}, 1),
        ("k", DEEP, 1),
        ("k", {}, {"s": SURROGATE}),
    ],
)
def test_run_once_refuses_unstorable_keys_requests_and_responses(key, request_, response):
    with pytest.raises(InvalidInput):
        run_once(key, request_, lambda: response)
    assert not IdempotencyKey.objects.filter(status="completed").exists()


def test_claim_filters_refuse_unstorable_text(make_items):
    make_items(1)
    manager = LeaseManager("w")
    for filters in (
        {"work_type_filter": "x\x00"},
        {"queue_filter": [SURROGATE]},
        {"task_id_filter": "t" * 300},
    ):
        with pytest.raises(InvalidInput):
            manager.acquire_lease(**filters)
    assert WorkItem.objects.filter(status="pending").count() == 1
    with pytest.raises(InvalidInput):
        LeaseManager(SURROGATE)


def test_purgeitems_answers_an_age_out_of_range_with_one_line():
    with pytest.raises(CommandError, match="at most"):
        call_command("purgeitems", "--older-than", "99999999999999d")


def test_json_nested_within_the_limit_is_accepted(make_items):
    nested: list = []
    for _ in range(90):
        nested = [nested]
    item = enqueue("t", "test.echo", {"nested": nested})
    assert WorkItem.objects.get(pk=item.pk).input_data == {"nested": nested}


def test_a_small_max_payload_bytes_never_keeps_a_worker_from_recording_a_failure(
    leasing_settings,
):
    """The worker's own record of a failure (its error and traceback) outgrew a small
    MAX_PAYLOAD_BYTES: the worker handed the item back without an attempt, claimed it
    again, and looped, blocking what waited behind it. Its own records are bounded by
    how they are built, not by that setting, which bounds what users store."""
    leasing_settings(MAX_PAYLOAD_BYTES=300, RETRY_BACKOFF_BASE=0.01)
    failing = enqueue("failing", "test.always_fail", max_retries=1)
    good = enqueue("good", "test.echo")
    summary = WorkerRuntime(WorkerOptions(concurrency=1, burst=True, poll_interval=0.05)).run()
    assert summary.reason == "burst-done"
    assert (summary.claimed, summary.retried, summary.failed) == (3, 1, 1)
    row = WorkItem.objects.get(pk=failing.pk)
    assert (row.status, row.retry_count) == ("failed", 1)
    boundaries = Checkpoint.objects.filter(task_id="failing", checkpoint_type="error_boundary")
    assert boundaries.count() == 2
    assert all(len(str(b.snapshot_data)) > 300 for b in boundaries)
    assert WorkItem.objects.get(pk=good.pk).status == "completed"
