"""Tables, constraints and named filters."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from leasing import LeaseManager
from leasing.exceptions import CheckpointImmutable, InvalidStatus
from leasing.models import Checkpoint, IdempotencyKey, Worker, WorkItem
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db


def columns(table: str) -> set[str]:
    with connection.cursor() as cursor:
        return {c.name for c in connection.introspection.get_table_description(cursor, table)}


def test_tables_and_columns_are_named_as_the_spec_says():
    assert columns("work_items") >= {
        "work_item_id", "task_id", "work_type", "status", "priority", "lease_holder",
        "lease_token", "lease_acquired_at", "lease_expires_at", "heartbeat_at", "progress_at",
        "retry_count", "max_retries", "run_after", "queue_name", "input_data", "output_data",
        "error_message", "created_at", "started_at", "completed_at", "updated_at",
    }  # fmt: skip
    assert columns("checkpoints") == {
        "checkpoint_id", "task_id", "work_item_id", "checkpoint_type", "sequence_number",
        "snapshot_data", "metadata", "created_at",
    }  # fmt: skip
    assert columns("idempotency_keys") == {
        "idempotency_key", "task_id", "work_item_id", "request_hash", "response_data",
        "status", "created_at", "completed_at", "expires_at", "lease_token",
    }  # fmt: skip
    assert {"worker_id", "role", "hostname", "pid", "started_at", "last_seen_at", "stopped_at",
            "status", "concurrency", "work_types"} <= columns("workers")  # fmt: skip


def test_status_check_constraint_rejects_unknown_status(make_items):
    [item] = make_items(1)
    with pytest.raises(IntegrityError), transaction.atomic():
        WorkItem.objects.filter(pk=item.pk).update(status="paused")


def test_in_progress_row_needs_a_lease(make_items):
    [item] = make_items(1)
    with pytest.raises(IntegrityError), transaction.atomic():
        WorkItem.objects.filter(pk=item.pk).update(status="in_progress")


def test_checkpoint_type_check_constraint():
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO checkpoints (checkpoint_id, task_id, checkpoint_type, sequence_number,"
            " snapshot_data, created_at) VALUES ('c1', 't', 'coffee_break', 1, '{}', %s)",
            [database_now()],
        )


def test_idempotency_and_worker_status_checks():
    with pytest.raises(IntegrityError), transaction.atomic():
        IdempotencyKey.objects.create(idempotency_key="k", request_hash="sha256:x", status="done")
    with pytest.raises(IntegrityError), transaction.atomic():
        Worker.objects.create(worker_id="w", hostname="h", pid=1, status="sleeping")


def test_updated_at_moves_on_save(make_items):
    [item] = make_items(1)
    row = WorkItem.objects.get(pk=item.pk)
    first = row.updated_at
    row.priority = 3
    row.save(update_fields=["priority"])
    assert row.updated_at >= first
    assert WorkItem.objects.get(pk=item.pk).updated_at == row.updated_at


def test_checkpoint_rows_cannot_be_updated_through_the_orm(make_items):
    from leasing import create_checkpoint

    cp = create_checkpoint("t", "manual_checkpoint", {"a": 1})
    cp.snapshot_data = {"a": 2}
    with pytest.raises(CheckpointImmutable):
        cp.save()
    with pytest.raises(CheckpointImmutable):
        Checkpoint.objects.filter(pk=cp.pk).update(snapshot_data={"a": 3})
    with pytest.raises(CheckpointImmutable):
        cp.delete()
    assert Checkpoint.objects.get(pk=cp.pk).snapshot_data == {"a": 1}


def test_named_filters(make_items):
    items = make_items(5)
    manager = LeaseManager("w1")
    leases = manager.acquire_leases(3, lease_duration_seconds=60)
    now = database_now()
    # one expired, one stale, one healthy
    WorkItem.objects.filter(pk=leases[0].work_item_id).update(
        lease_expires_at=now - timedelta(seconds=5)
    )
    WorkItem.objects.filter(pk=leases[1].work_item_id).update(
        heartbeat_at=now - timedelta(seconds=500)
    )
    assert WorkItem.objects.pending().count() == 2
    assert WorkItem.objects.claimable().count() == 2
    assert WorkItem.objects.in_progress().count() == 3
    assert WorkItem.objects.held_by("w1").count() == 3
    assert WorkItem.objects.held_by("w2").count() == 0
    assert list(WorkItem.objects.expired().values_list("pk", flat=True)) == [leases[0].id]
    assert list(WorkItem.objects.stale().values_list("pk", flat=True)) == [leases[1].id]
    assert list(WorkItem.objects.healthy().values_list("pk", flat=True)) == [leases[2].id]
    assert WorkItem.objects.with_lease_health("expired").count() == 1
    assert WorkItem.objects.for_task(items[4].task_id).count() == 1
    assert WorkItem.objects.with_status("pending", "in_progress").count() == 5
    with pytest.raises(InvalidStatus, match="Unknown work item status 'paused'"):
        WorkItem.objects.with_status("paused")
    with pytest.raises(InvalidStatus):
        WorkItem.objects.with_lease_health("sleepy")
