"""Checkpoints: append-only per-task sequences, fenced by the lease."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from leasing import LeaseManager, RecoverySweep, enqueue
from leasing.exceptions import (
    CheckpointImmutable,
    InvalidCheckpointType,
    InvalidInput,
    LeaseLostError,
    PayloadNotSerializable,
    PayloadTooLarge,
    WorkItemNotFound,
)
from leasing.models import Checkpoint, RollupMark, WorkItem
from leasing.services.checkpoints import (
    checkpoints_for,
    cleanup_checkpoints,
    cleanup_checkpoints_since_mark,
    create_checkpoint,
    latest_checkpoint,
    resume_state,
)
from leasing.sql import marks
from leasing.sql.runner import database_now, run
from leasing.storage import storage_for

pytestmark = pytest.mark.django_db


def numbers(task_id: str) -> list[int]:
    return list(checkpoints_for(task_id).values_list("sequence_number", flat=True))


def all_rows() -> list[dict]:
    return list(Checkpoint.objects.order_by("checkpoint_id").values())


# --- appending -----------------------------------------------------------------------------


def test_appends_number_each_task_from_one(db):
    before = database_now()
    first = create_checkpoint("a", "iteration_start", {"i": 0}, metadata={"by": "test"})
    second = create_checkpoint("a", "iteration_end", {"i": 0})
    other = create_checkpoint("b", "manual_checkpoint", {})
    after = database_now()

    assert (first.sequence_number, second.sequence_number, other.sequence_number) == (1, 2, 1)
    stored = Checkpoint.objects.get(pk=first.pk)
    assert stored.task_id == "a" and stored.checkpoint_type == "iteration_start"
    assert stored.snapshot_data == {"i": 0} and stored.metadata == {"by": "test"}
    assert stored.work_item_id is None
    assert before <= stored.created_at <= after
    assert first.created_at == stored.created_at
    assert [c.pk for c in checkpoints_for("a")] == [first.pk, second.pk]


def test_a_checkpoint_can_name_its_work_item(db):
    item = enqueue("task-x", "noop")
    checkpoint = create_checkpoint("task-x", "approval_point", {"ok": True}, work_item=item)
    assert Checkpoint.objects.get(pk=checkpoint.pk).work_item_id == item.pk
    by_id = create_checkpoint("task-x", "approval_point", {"ok": True}, work_item=item.pk)
    assert by_id.sequence_number == 2 and by_id.work_item_id == item.pk


@pytest.mark.django_db(transaction=True)
def test_sixteen_threads_appending_to_one_task_never_collide(db, threads):
    def append(i: int) -> list[int]:
        return [
            create_checkpoint("shared", "tool_executed", {"thread": i, "n": n}).sequence_number
            for n in range(50)
        ]

    results = threads(16, append)

    got = [number for result in results for number in result]
    assert sorted(got) == list(range(1, 801))
    assert numbers("shared") == list(range(1, 801))
    assert Checkpoint.objects.filter(task_id="shared").count() == 800
    # Each thread's own appends come out in increasing order.
    for result in results:
        assert result == sorted(result)


# --- immutability ---------------------------------------------------------------------------


def test_checkpoints_cannot_be_updated_through_the_model(db):
    checkpoint = create_checkpoint("t", "manual_checkpoint", {"v": 1})
    stored = Checkpoint.objects.get(pk=checkpoint.pk)
    stored.snapshot_data = {"v": 2}
    with pytest.raises(CheckpointImmutable):
        stored.save()
    with pytest.raises(CheckpointImmutable):
        Checkpoint.objects.filter(pk=checkpoint.pk).update(snapshot_data={"v": 3})
    # bulk_update() fails inside its own savepoint-less atomic block, which
    # poisons an enclosing transaction (the test's): give it a savepoint.
    with pytest.raises(CheckpointImmutable), transaction.atomic():
        Checkpoint.objects.bulk_update([stored], ["snapshot_data"])
    with pytest.raises(CheckpointImmutable):
        stored.delete()
    with pytest.raises(CheckpointImmutable):
        Checkpoint.objects.filter(pk=checkpoint.pk).delete()
    assert Checkpoint.objects.get(pk=checkpoint.pk).snapshot_data == {"v": 1}


def test_the_database_refuses_an_update_even_from_raw_sql(db, vendor):
    checkpoint = create_checkpoint("t", "manual_checkpoint", {"v": 1})
    before = all_rows()
    for sql in (
        "UPDATE checkpoints SET sequence_number = 99 WHERE checkpoint_id = %s",
        "UPDATE checkpoints SET checkpoint_type = 'error_boundary' WHERE checkpoint_id = %s",
    ):
        with (
            pytest.raises(IntegrityError) as exc,
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql, [checkpoint.pk])
        assert "append-only" in str(exc.value)
    assert all_rows() == before


# --- retention ----------------------------------------------------------------------------


def test_retention_keeps_exactly_the_newest_per_task_and_never_reuses_numbers(db):
    for n in range(10):
        create_checkpoint("big", "tool_executed", {"n": n})
    for n in range(3):
        create_checkpoint("small", "tool_executed", {"n": n})

    assert cleanup_checkpoints(4) == 6
    assert numbers("big") == [7, 8, 9, 10]
    assert numbers("small") == [1, 2, 3]
    assert cleanup_checkpoints(4) == 0

    # The newest row always survives, so numbering carries on after it.
    assert create_checkpoint("big", "tool_executed", {}).sequence_number == 11
    assert cleanup_checkpoints(1) == 4 + 2
    assert numbers("big") == [11] and numbers("small") == [3]
    assert create_checkpoint("big", "tool_executed", {}).sequence_number == 12
    assert create_checkpoint("small", "tool_executed", {}).sequence_number == 4


def test_retention_since_only_examines_recently_changed_tasks(db):
    for n in range(5):
        create_checkpoint("old", "tool_executed", {"n": n})
    cutoff = database_now() + timedelta(microseconds=1)
    # Rows are stamped by the database clock; make sure "new" is after the cutoff.
    while database_now() <= cutoff:
        pass
    for n in range(5):
        create_checkpoint("new", "tool_executed", {"n": n})

    assert cleanup_checkpoints(2, since=cutoff) == 3
    assert numbers("new") == [4, 5]
    assert numbers("old") == [1, 2, 3, 4, 5]
    assert cleanup_checkpoints(2) == 3
    assert numbers("old") == [4, 5]


def test_retention_counts_rows_not_numbers_when_a_task_has_gaps(db):
    # Purging a work item deletes its checkpoints (ON DELETE CASCADE), which
    # can leave holes in the middle of a task's numbering.
    Checkpoint.objects.bulk_create(
        Checkpoint(task_id="gappy", checkpoint_type="tool_executed", sequence_number=n,
                   snapshot_data={"n": n})
        for n in (1, 2, 3, 8, 9, 10)
    )  # fmt: skip
    Checkpoint.objects.bulk_create(
        Checkpoint(task_id="short", checkpoint_type="tool_executed", sequence_number=n,
                   snapshot_data={"n": n})
        for n in (7, 9)
    )  # fmt: skip

    # The newest five rows stay, not the rows numbered within five of the top.
    assert cleanup_checkpoints(5) == 1
    assert numbers("gappy") == [2, 3, 8, 9, 10]
    # Numbered past the retention but holding fewer rows: nothing to delete.
    assert numbers("short") == [7, 9]


def test_retention_since_trims_only_the_tasks_past_it(db):
    for n in range(3):
        create_checkpoint("within", "tool_executed", {"n": n})
    for n in range(6):
        create_checkpoint("beyond", "tool_executed", {"n": n})
    before = database_now() - timedelta(minutes=1)

    assert cleanup_checkpoints(4, since=before) == 2
    assert numbers("within") == [1, 2, 3]
    assert numbers("beyond") == [3, 4, 5, 6]


@pytest.mark.django_db(transaction=True)
def test_retention_running_beside_appends_never_reuses_a_number(db, threads):
    appenders = 3
    finished: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> list[int] | int:
        if i == 0:  # the cleaner prunes until every appender is done
            deleted = 0
            while True:
                with lock:
                    done = len(finished) == appenders
                deleted += cleanup_checkpoints(5)
                if done:
                    return deleted
        try:
            return [
                create_checkpoint("busy", "tool_executed", {"n": n}).sequence_number
                for n in range(60)
            ]
        finally:
            with lock:
                finished.append(i)

    results = threads(1 + appenders, work)

    appended = [n for result in results[1:] for n in result]
    assert sorted(appended) == list(range(1, 181))  # unique and gapless: none reused
    assert results[0] == 175
    assert numbers("busy") == [176, 177, 178, 179, 180]


@pytest.mark.django_db(transaction=True)
def test_concurrent_cleanups_delete_each_row_once(db, threads):
    Checkpoint.objects.bulk_create(
        Checkpoint(
            task_id=f"task-{t}",
            checkpoint_type="tool_executed",
            sequence_number=n,
            snapshot_data={"n": n},
        )
        for t in range(50)
        for n in range(1, 21)
    )

    deleted = threads(4, lambda i: cleanup_checkpoints(5))

    assert sum(deleted) == 50 * 15  # each row deleted by exactly one of them
    for t in range(50):
        assert numbers(f"task-{t}") == [16, 17, 18, 19, 20]


@pytest.mark.parametrize("retention", [0, -1, 1.5, "3", None])
def test_bad_retention_deletes_nothing(db, retention):
    for n in range(3):
        create_checkpoint("t", "tool_executed", {"n": n})
    with pytest.raises(InvalidInput):
        cleanup_checkpoints(retention)
    assert numbers("t") == [1, 2, 3]


# --- the sweep's cleanup, from its mark --------------------------------------------------


def seed(task_id: str, count: int, created_at) -> None:
    """Checkpoints stamped with a past time, as data seeding writes them."""
    Checkpoint.objects.bulk_create(
        Checkpoint(task_id=task_id, checkpoint_type="tool_executed", sequence_number=n,
                   snapshot_data={"n": n}, created_at=created_at)
        for n in range(1, count + 1)
    )  # fmt: skip


def mark(name: str):
    return RollupMark.objects.get(name=name).through


def test_a_new_sweep_carries_on_from_where_the_last_cleanup_began(db):
    def new_sweep_pass() -> int:
        # A new object each time: a new sweep process, or `recoverysweep --once` under cron.
        sweep = RecoverySweep(scan_interval_seconds=5, checkpoint_retention_limit=4)
        return sweep.scan_and_recover().checkpoints_deleted

    an_hour_ago = database_now() - timedelta(hours=1)
    seed("seeded-first", 6, an_hour_ago)
    # The first cleanup to a retention examines every task.
    assert new_sweep_pass() == 2
    assert numbers("seeded-first") == [3, 4, 5, 6]

    seed("seeded-later", 6, an_hour_ago)
    for n in range(6):
        create_checkpoint("live", "tool_executed", {"n": n})
    # The next one, in a new sweep, examines only the tasks given checkpoints
    # since the last one began (less a minute): rows stamped an hour back are
    # not among them, the task written to now is.
    assert new_sweep_pass() == 2
    assert numbers("live") == [3, 4, 5, 6]
    assert numbers("seeded-later") == [1, 2, 3, 4, 5, 6]
    assert new_sweep_pass() == 0

    # A day after the last whole-table cleanup, the next examines every task again.
    full = "checkpoint_full_cleanup:4"
    run("default", marks.set_mark(storage_for(), full, mark(full) - timedelta(days=1)))
    assert new_sweep_pass() == 2
    assert numbers("seeded-later") == [3, 4, 5, 6]
    assert new_sweep_pass() == 0


def test_each_retention_keeps_its_own_marks_and_a_mark_never_goes_back(db):
    now = database_now()
    seed("seeded", 6, now - timedelta(hours=1))
    first = cleanup_checkpoints_since_mark(5, at=now)
    assert (first.deleted, first.whole_table) == (1, True)
    assert mark("checkpoint_cleanup:5") == mark("checkpoint_full_cleanup:5") == now
    assert cleanup_checkpoints_since_mark(5, at=now).whole_table is False
    # Another retention has not cleaned the table yet: its first cleanup reads all of it.
    second = cleanup_checkpoints_since_mark(3, at=now)
    assert (second.deleted, second.whole_table) == (2, True)
    # A pass that began earlier (a slower sweep beside this one) leaves the mark where it is.
    cleanup_checkpoints_since_mark(5, at=now - timedelta(minutes=5))
    assert mark("checkpoint_cleanup:5") == now


@pytest.mark.django_db(transaction=True)
def test_sweeps_cleaning_at_once_delete_each_row_once_and_keep_the_newest_mark(db, threads):
    now = database_now()
    seed_many = (
        Checkpoint(task_id=f"task-{t}", checkpoint_type="tool_executed", sequence_number=n,
                   snapshot_data={"n": n})
        for t in range(50)
        for n in range(1, 21)
    )  # fmt: skip
    Checkpoint.objects.bulk_create(seed_many)
    passes = [now + timedelta(seconds=i) for i in range(4)]

    results = threads(4, lambda i: cleanup_checkpoints_since_mark(5, at=passes[i]))

    assert sum(r.deleted for r in results) == 50 * 15  # each row deleted by exactly one
    for t in range(50):
        assert numbers(f"task-{t}") == [16, 17, 18, 19, 20]
    assert mark("checkpoint_cleanup:5") == passes[-1]
    # Whichever of them read no mark examined every task; the others, what changed.
    assert mark("checkpoint_full_cleanup:5") in passes
    assert any(r.whole_table for r in results)


@pytest.mark.parametrize(
    "retention, at",
    [(0, "now"), (None, "now"), ("5", "now"), (5, None), (5, "2026-01-01"), (5, "naive")],
)
def test_bad_input_to_the_marked_cleanup_deletes_and_marks_nothing(db, retention, at):
    now = database_now()
    at = {"now": now, "naive": now.replace(tzinfo=None)}.get(at, at)
    for n in range(3):
        create_checkpoint("t", "tool_executed", {"n": n})
    with pytest.raises(InvalidInput):
        cleanup_checkpoints_since_mark(retention, at=at)
    assert numbers("t") == [1, 2, 3]
    assert not RollupMark.objects.exists()


# --- reading --------------------------------------------------------------------------------


def test_resume_state_is_the_last_iteration_end_snapshot(db):
    assert resume_state("agent") is None
    create_checkpoint("agent", "iteration_start", {"page": 1})
    assert resume_state("agent") is None
    create_checkpoint("agent", "iteration_end", {"page": 1, "total": 10})
    create_checkpoint("agent", "iteration_start", {"page": 2})
    create_checkpoint("agent", "iteration_end", {"page": 2, "total": 25})
    create_checkpoint("agent", "tool_executed", {"tool": "search"})
    create_checkpoint("other", "iteration_end", {"page": 99})

    assert resume_state("agent") == {"page": 2, "total": 25}
    assert latest_checkpoint("agent").checkpoint_type == "tool_executed"
    assert latest_checkpoint("agent", "iteration_start").snapshot_data == {"page": 2}
    assert latest_checkpoint("nobody") is None
    with pytest.raises(InvalidCheckpointType):
        latest_checkpoint("agent", "nonsense")


# --- fencing --------------------------------------------------------------------------------


def test_a_checkpoint_under_a_held_lease_is_attached_to_the_item(db):
    item = enqueue("job", "noop")
    lease = LeaseManager("w1").acquire_lease()
    checkpoint = create_checkpoint("job", "iteration_end", {"step": 1}, lease=lease)
    assert checkpoint.work_item_id == item.pk
    assert Checkpoint.objects.get(pk=checkpoint.pk).work_item_id == item.pk


def test_a_checkpoint_with_a_lost_lease_raises_and_writes_nothing(db):
    item = enqueue("job", "noop")
    zombie = LeaseManager("zombie").acquire_lease(lease_duration_seconds=30)
    create_checkpoint("job", "iteration_end", {"step": 1}, lease=zombie)
    WorkItem.objects.filter(pk=item.pk).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )
    RecoverySweep(scan_interval_seconds=5).scan_and_recover()  # writes an error_boundary
    before = all_rows()

    with pytest.raises(LeaseLostError):
        create_checkpoint("job", "iteration_end", {"step": 2}, lease=zombie)
    assert all_rows() == before

    # Re-claimed by someone else: the token moved on, the zombie is still refused.
    successor = LeaseManager("successor").acquire_lease()
    assert successor.token == zombie.token + 1
    with pytest.raises(LeaseLostError):
        create_checkpoint("job", "iteration_end", {"step": 2}, lease=zombie)
    assert all_rows() == before
    assert create_checkpoint("job", "iteration_end", {"step": 2}, lease=successor)
    assert resume_state("job") == {"step": 2}


# --- bad input --------------------------------------------------------------------------------


def test_bad_input_gets_a_specific_error_and_writes_nothing(db, leasing_settings):
    leasing_settings(MAX_PAYLOAD_BYTES=200)
    item = enqueue("job", "noop")
    other_task_item = enqueue("elsewhere", "noop")
    lease = LeaseManager("w1").acquire_lease(task_id_filter="job")
    create_checkpoint("job", "manual_checkpoint", {"ok": True})
    before = all_rows()

    cases = [
        (InvalidCheckpointType, lambda: create_checkpoint("job", "made_up", {})),
        (InvalidCheckpointType, lambda: create_checkpoint("job", None, {})),
        (PayloadNotSerializable, lambda: create_checkpoint("job", "tool_executed", {"x": {1}})),
        (PayloadNotSerializable, lambda: create_checkpoint("job", "tool_executed", object())),
        (PayloadNotSerializable, lambda: create_checkpoint("job", "tool_executed", float("nan"))),
        (PayloadTooLarge, lambda: create_checkpoint("job", "tool_executed", {"x": "y" * 300})),
        (InvalidInput, lambda: create_checkpoint("job", "tool_executed", None)),
        (InvalidInput, lambda: create_checkpoint("", "tool_executed", {})),
        (InvalidInput, lambda: create_checkpoint("job", "tool_executed", {}, metadata=[1])),
        (
            WorkItemNotFound,
            lambda: create_checkpoint("job", "tool_executed", {}, work_item="01NOSUCHITEM"),
        ),
        (
            InvalidInput,
            lambda: create_checkpoint("job", "tool_executed", {}, work_item=other_task_item),
        ),
        (InvalidInput, lambda: create_checkpoint("elsewhere", "tool_executed", {}, lease=lease)),
        (
            InvalidInput,
            lambda: create_checkpoint(
                "job", "tool_executed", {}, lease=lease, work_item=other_task_item
            ),
        ),
        (InvalidInput, lambda: create_checkpoint("job", "tool_executed", {}, lease="token")),
    ]
    for error, call in cases:
        with pytest.raises(error):
            call()
    assert all_rows() == before
    assert item.pk == lease.work_item_id
