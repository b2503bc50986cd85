"""Checkpoints where they meet retries, operator actions and retention."""

from __future__ import annotations

from datetime import timedelta

import pytest

from leasing import LeaseLostError, RecoverySweep, apply_action, enqueue
from leasing.exceptions import InvalidInput, PayloadNotSerializable, PayloadTooLarge
from leasing.models import Checkpoint, IdempotencyKey, WorkItem
from leasing.services.checkpoints import checkpoints_for, cleanup_checkpoints, resume_state
from tests.support.helpers import database_now
from tests.support.items import claim, context

pytestmark = pytest.mark.django_db


def types(task_id: str) -> list[tuple[int, str]]:
    return list(checkpoints_for(task_id).values_list("sequence_number", "checkpoint_type"))


def all_rows() -> list[dict]:
    return list(Checkpoint.objects.order_by("checkpoint_id").values())


def expire_and_sweep(item_id: str, retention: int) -> int:
    """The lease runs out and a sweep pass recovers it (an `error_boundary`), then
    cleans checkpoints up to `retention`; returns how many it deleted."""
    WorkItem.objects.filter(pk=item_id).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )
    sweep = RecoverySweep(scan_interval_seconds=5, checkpoint_retention_limit=retention)
    return sweep.scan_and_recover().checkpoints_deleted


def ops(action: str, item_id: str) -> None:
    result = apply_action(action, item_id, expected_token=None, actor="ops", reason="test")
    assert result.applied, result.detail


# --- retention and the resume point ---------------------------------------------------------


@pytest.mark.parametrize("retention", [1, 2])
def test_retention_never_prunes_the_resume_point_of_an_item_between_attempts(db, retention):
    """The attempts' own records (the sweep's `error_boundary`s, operators'
    `state_transition`s) pushed the last `iteration_end` out of the newest
    CHECKPOINT_RETENTION, and the next attempt started over."""
    item = enqueue("import", "noop", max_retries=10)
    first = context(claim())
    first.checkpoint("iteration_end", {"page": 3})
    expire_and_sweep(item.pk, retention)  # attempt 1 dies: error_boundary

    for _ in range(2):  # two more attempts that die before writing anything
        claim()
        expire_and_sweep(item.pk, retention)
    claim()
    ops("force_release", item.pk)  # and one an operator takes back: state_transition
    RecoverySweep(scan_interval_seconds=5, checkpoint_retention_limit=retention).scan_and_recover()

    kinds = [kind for _, kind in types("import")]
    assert kinds.count("iteration_end") == 1
    assert len(kinds) == retention + 1  # the newest `retention`, and the resume point
    assert resume_state("import") == {"page": 3}
    retry = context(claim())
    assert retry.resume_state() == {"page": 3}


def test_retention_keeps_only_the_newest_resume_point_and_counts_it_beside_the_others(db):
    for page in range(1, 6):
        Checkpoint.objects.create(
            task_id="t",
            checkpoint_type="iteration_end",
            sequence_number=page,
            snapshot_data={"page": page},
        )
    for n in range(6, 9):
        Checkpoint.objects.create(
            task_id="t", checkpoint_type="error_boundary", sequence_number=n, snapshot_data={}
        )

    assert cleanup_checkpoints(2) == 5  # 1-4 and 6 go; 5 stays as the resume point
    assert types("t") == [(5, "iteration_end"), (7, "error_boundary"), (8, "error_boundary")]
    assert resume_state("t") == {"page": 5}
    assert cleanup_checkpoints(2) == 0
    # A resume point among the newest is one of them: nothing more is kept.
    Checkpoint.objects.create(
        task_id="t", checkpoint_type="iteration_end", sequence_number=9, snapshot_data={"page": 9}
    )
    assert cleanup_checkpoints(2) == 2
    assert types("t") == [(8, "error_boundary"), (9, "iteration_end")]


# --- operator actions and the fence ---------------------------------------------------------


def test_a_force_released_run_writes_nothing_and_the_next_run_resumes_from_its_fenced_writes(db):
    item = enqueue("job", "noop")
    zombie = context(claim("slow"))
    zombie.checkpoint("iteration_end", {"page": 1})
    ops("force_release", item.pk)
    before = all_rows()

    ran = []
    with pytest.raises(LeaseLostError):
        zombie.checkpoint("iteration_end", {"page": 2})
    assert zombie.lease_lost
    with pytest.raises(LeaseLostError):  # refused locally now: fn never runs
        zombie.run_once("mail", {"page": 2}, lambda: ran.append(1))
    assert all_rows() == before and ran == [] and not IdempotencyKey.objects.exists()

    successor = context(claim("fresh"))
    assert successor.lease.token == zombie.lease.token + 1
    assert successor.resume_state() == {"page": 1}


def test_an_operator_retry_of_a_failed_item_resumes_from_its_last_checkpoint(db):
    """Like the worker's retry and the sweep's: the resume point is the task's, so
    a retried run carries on; its attempts are counted from 1 again."""
    item = enqueue("job", "noop", max_retries=0)
    failed = context(claim())
    failed.checkpoint("iteration_end", {"page": 4})
    ops("force_fail", item.pk)
    with pytest.raises(LeaseLostError):  # the failed run's late write is fenced
        failed.checkpoint("iteration_end", {"page": 5})
    ops("retry", item.pk)

    retried = context(claim())
    assert retried.attempt == 1
    assert retried.resume_state() == {"page": 4}
    retried.checkpoint("iteration_end", {"page": 5})
    kinds = [kind for _, kind in types("job")]
    assert kinds == ["iteration_end", "state_transition", "state_transition", "iteration_end"]


# --- bad input through the context ------------------------------------------------------------


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    "snapshot, error",
    [
        ({"x": float("nan")}, PayloadNotSerializable),
        ({"x": float("inf")}, PayloadNotSerializable),
        ({"x": "a\x00b"}, PayloadNotSerializable),
        ({"a\x00": 1}, PayloadNotSerializable),
        ({"x": "\ud800"}, PayloadNotSerializable),
        ({"x": "y" * 400}, PayloadTooLarge),
        (nested(101), PayloadNotSerializable),
        ({"when": object()}, PayloadNotSerializable),
        (None, InvalidInput),
    ],
    ids=["nan", "inf", "nul", "nul-key", "surrogate", "large", "deep", "object", "none"],
)
def test_a_snapshot_json_cannot_hold_is_refused_and_the_run_keeps_its_lease(
    db, leasing_settings, snapshot, error
):
    leasing_settings(MAX_PAYLOAD_BYTES=300)
    item = enqueue("job", "noop")
    ctx = context(claim())
    ctx.checkpoint("iteration_end", {"page": 1})
    before = all_rows()

    with pytest.raises(error):
        ctx.checkpoint("iteration_end", snapshot)

    assert all_rows() == before
    assert not ctx.lease_lost
    row = WorkItem.objects.get(pk=item.pk)
    assert (row.status, row.lease_token, row.retry_count) == ("in_progress", ctx.lease.token, 0)
    assert ctx.checkpoint("iteration_end", {"page": 2}).sequence_number == 2
    assert ctx.resume_state() == {"page": 2}
    # The deepest snapshot allowed is stored.
    assert ctx.checkpoint("tool_executed", nested(100)).sequence_number == 3
