"""The claim/complete hot path reads rows by position and passes batches as JSON.

A claimed row becomes a `Lease` by position (`sql.LEASE_COLUMNS`), its
timestamps through psycopg's own loader, and a batch of finished items
reaches PostgreSQL as one JSON text: each shortcut must give exactly what
the column holds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection, transaction

from leasing import LeaseManager, enqueue, enqueue_many
from leasing.exceptions import DatabaseUnavailable
from leasing.models import WorkItem
from leasing.services.held import Lease, leases_from_rows
from leasing.sql.runner import run, run_rows
from leasing.sql.work_items import LEASE_COLUMNS
from leasing.storage.postgres import CLAIM_PLANNER_OFF
from leasing.worker import WorkerOptions, WorkerRuntime

pytestmark = pytest.mark.django_db(transaction=True)

# Lease field -> the claimed column it comes from (worker_id is the claimer's own).
FIELD_COLUMN = {
    "work_item_id": "work_item_id",
    "task_id": "task_id",
    "work_type": "work_type",
    "queue_name": "queue_name",
    "priority": "priority",
    "input_data": "input_data",
    "token": "lease_token",
    "acquired_at": "lease_acquired_at",
    "expires_at": "lease_expires_at",
    "deadline_at": "lease_deadline_at",
    "retry_count": "retry_count",
    "max_retries": "max_retries",
    "interruptions": "interruptions",
    "created_at": "created_at",
    "trace_context": "trace_context",
}


def test_every_lease_field_is_read_from_its_own_column_position():
    assert [f for f in Lease._fields if f != "worker_id"] == list(FIELD_COLUMN)
    assert tuple(FIELD_COLUMN.values()) == LEASE_COLUMNS
    # A distinct value per column: a shifted position shows as a wrong value.
    base = datetime(2026, 1, 1, tzinfo=UTC)
    expected = {}
    for i, column in enumerate(LEASE_COLUMNS):
        if column.endswith("_at"):
            expected[column] = base + timedelta(days=i)
        elif column in ("priority", "lease_token", "retry_count", "max_retries", "interruptions"):
            expected[column] = 100 + i
        elif column in ("input_data", "trace_context"):
            expected[column] = {"column": i}
        else:
            expected[column] = f"value {i}"
    row = tuple(
        json.dumps(expected[c]) if c in ("input_data", "trace_context") else expected[c]
        for c in LEASE_COLUMNS
    )
    [lease] = leases_from_rows([row], "the-worker")
    for field, column in FIELD_COLUMN.items():
        assert getattr(lease, field) == expected[column], field
    assert lease.worker_id == "the-worker"
    # A batch whose timestamps came aware in UTC takes them as they are; one
    # whose timestamps are text (SQLite) or in another zone converts each.
    as_text = tuple(v.isoformat() if isinstance(v, datetime) else v for v in row)
    in_paris = tuple(
        v.astimezone(timezone(timedelta(hours=1))) if isinstance(v, datetime) else v for v in row
    )
    for rows in ([row, row], [as_text], [in_paris]):
        for batch_lease in leases_from_rows(rows, "the-worker"):
            assert batch_lease == lease
            assert all(
                getattr(batch_lease, f).tzinfo is UTC
                for f in ("acquired_at", "expires_at", "deadline_at", "created_at")
            )
    assert leases_from_rows([], "the-worker") == []


def test_a_claimed_lease_holds_what_the_row_holds():
    enqueue("t1", "test.echo", input_data={"n": 1}, priority=7, queue_name="q1", max_retries=5)
    lease = LeaseManager("w1").acquire_lease(60)
    assert lease is not None
    row = WorkItem.objects.get(pk=lease.work_item_id)
    assert (lease.task_id, lease.work_type, lease.queue_name, lease.priority) == (
        "t1",
        "test.echo",
        "q1",
        7,
    )
    assert lease.input_data == {"n": 1}
    assert (lease.token, lease.retry_count, lease.max_retries, lease.interruptions) == (
        row.lease_token,
        row.retry_count,
        5,
        row.interruptions,
    )
    assert lease.acquired_at == row.lease_acquired_at
    assert lease.expires_at == row.lease_expires_at
    assert lease.deadline_at == row.lease_deadline_at
    assert lease.created_at == row.created_at
    assert all(
        t.tzinfo is UTC
        for t in (lease.acquired_at, lease.expires_at, lease.deadline_at, lease.created_at)
    )


@pytest.mark.postgres
def test_lease_times_are_utc_instants_whatever_the_session_time_zone():
    enqueue("t1", "test.echo")
    with connection.cursor() as cursor:
        cursor.execute("SET TIME ZONE 'Asia/Tokyo'")
    try:
        lease = LeaseManager("w1").acquire_lease(60)
    finally:
        connection.close()  # the next test gets a connection in UTC again
    assert lease is not None
    row = WorkItem.objects.get(pk=lease.work_item_id)
    assert lease.acquired_at.tzinfo is UTC
    assert lease.acquired_at == row.lease_acquired_at
    assert (lease.expires_at - lease.acquired_at).total_seconds() == pytest.approx(60)


ODD_TEXTS = [
    'quote " and backslash \\',
    "comma, {braces}, [brackets]",
    "unicode: \u00e9\u4e2d\U0001f600",
    "NULL",
    "",
    "'single' ; DROP TABLE work_items; --",
]


@pytest.mark.postgres
def test_a_batch_completion_stores_each_output_exactly():
    items = enqueue_many(
        [
            {"task_id": f"t{i}", "work_type": "test.echo", "input_data": text}
            for i, text in enumerate(ODD_TEXTS * 5)
        ]
    )
    summary = WorkerRuntime(WorkerOptions(concurrency=2, burst=True, poll_interval=0.05)).run()
    assert summary.completed == len(items)
    for item in items:
        row = WorkItem.objects.get(pk=item.pk)
        assert row.status == "completed"
        assert row.output_data == {"echo": item.input_data, "attempt": 1}


def _planner_settings() -> list[str]:
    values = []
    with connection.cursor() as cursor:
        for name in CLAIM_PLANNER_OFF:
            cursor.execute(f"SHOW {name}")
            values.append(cursor.fetchone()[0])
    return values


@pytest.mark.postgres
def test_a_claim_outside_a_transaction_leaves_no_planner_setting_behind():
    enqueue_many([{"task_id": f"t{i}", "work_type": "test.echo"} for i in range(3)])
    before = _planner_settings()
    assert "off" not in before
    assert len(LeaseManager("w").acquire_leases(2, 60)) == 2
    # Sent without the SET LOCAL ... TO DEFAULT tail: the implicit transaction
    # of the round trip ended and took the claim's settings with it.
    assert _planner_settings() == before


@pytest.mark.postgres
def test_a_claim_inside_a_transaction_restores_the_planner_settings_for_what_follows():
    enqueue_many([{"task_id": f"t{i}", "work_type": "test.echo"} for i in range(3)])
    before = _planner_settings()
    with transaction.atomic():
        assert len(LeaseManager("w").acquire_leases(2, 60)) == 2
        assert _planner_settings() == before
    assert _planner_settings() == before


def test_rows_come_from_the_result_set_that_has_them_or_are_none():
    enqueue("t1", "test.echo")
    update = ("UPDATE work_items SET priority = priority WHERE task_id = %s", ["t1"])
    assert run_rows("default", update) == []
    assert run("default", update) == []
    select = ("SELECT task_id, priority FROM work_items WHERE task_id = %s", ["t1"])
    assert run_rows("default", select) == [("t1", 0)]
    assert run("default", select) == [{"task_id": "t1", "priority": 0}]


@pytest.mark.postgres
def test_rows_after_statements_without_results_are_found():
    enqueue("t1", "test.echo")
    sql = (
        "SET LOCAL jit = off; SELECT task_id FROM work_items WHERE task_id = %s; "
        "SET LOCAL jit TO DEFAULT"
    )
    assert run_rows("default", (sql, ["t1"])) == [("t1",)]
    assert run("default", (sql, ["t1"])) == [{"task_id": "t1"}]


@pytest.mark.postgres
def test_a_claim_while_the_database_is_down_reports_it_unavailable(monkeypatch):
    # Building the claim must not connect on its own: a refused connection is
    # the runner's to report as an outage (the worker reconnects), never a
    # bare driver error (the worker would exit).
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "HOST", "127.0.0.1")
    monkeypatch.setitem(connection.settings_dict, "PORT", "1")  # nothing listens there
    try:
        with pytest.raises(DatabaseUnavailable):
            LeaseManager("w").acquire_leases(1, 60)
    finally:
        connection.close()


def _indexes_holding(item_id: str) -> set[str]:
    """The indexes of `work_items` whose condition holds for the item's row as it is now:
    those a row version like it enters (a claim or completion is never a HOT update)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'work_items'::regclass"
        )
        indexes = cursor.fetchall()
        holding = set()
        for name, condition in indexes:
            cursor.execute(
                f"SELECT EXISTS (SELECT 1 FROM work_items WHERE work_item_id = %s "
                f"AND ({condition or 'true'}))",
                [item_id],
            )
            if cursor.fetchone()[0]:
                holding.add(name)
    return holding


# What each step of the hot path writes (see migration 0019): fewer entries
# are a cheaper claim and completion; a new index here is a cost to weigh.
CLAIMED = {
    "work_items_pkey",
    "work_items_created_idx",
    "work_items_task_status_idx",
    "work_items_in_flight_idx",
    "work_items_lease_expiry_idx",
}
COMPLETED = {
    "work_items_pkey",
    "work_items_created_idx",
    "work_items_task_status_idx",
    "work_items_status_retry_idx",
    "work_items_finished_idx",
}


@pytest.mark.postgres
@pytest.mark.parametrize("payload", [None, {"customer": "acme"}])
def test_a_claim_and_a_completion_each_enter_five_indexes_and_the_payloads_own(payload):
    enqueue("t1", "test.echo", input_data=payload)
    manager = LeaseManager("w1")
    lease = manager.acquire_lease(60)
    assert lease is not None
    searchable = {"work_items_input_path_idx"} if payload is not None else set()
    assert _indexes_holding(lease.work_item_id) == CLAIMED | searchable
    assert manager.release_lease(lease.work_item_id, True, token=lease.token)
    assert _indexes_holding(lease.work_item_id) == COMPLETED | searchable
