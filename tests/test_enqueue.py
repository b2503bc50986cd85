"""enqueue() and enqueue_many(): validation first, then one INSERT."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from leasing import enqueue, enqueue_many
from leasing.exceptions import InvalidInput, PayloadNotSerializable, PayloadTooLarge
from leasing.models import WorkItem
from leasing.sql.runner import database_now

pytestmark = pytest.mark.django_db


def test_enqueue_stores_a_pending_item_with_database_timestamps():
    before = database_now()
    item = enqueue(
        "task-001", "resize", {"size": [1, 2]}, priority=4, max_retries=5, queue_name="images"
    )
    row = WorkItem.objects.get(pk=item.pk)
    assert len(item.work_item_id) == 26
    assert (row.task_id, row.work_type, row.status) == ("task-001", "resize", "pending")
    assert (row.priority, row.max_retries, row.queue_name) == (4, 5, "images")
    assert row.input_data == {"size": [1, 2]}
    assert row.lease_token == 0 and row.retry_count == 0 and row.lease_holder is None
    assert row.created_at >= before - timedelta(seconds=1)
    assert item.created_at == row.created_at and item.updated_at == row.updated_at


def test_max_retries_defaults_to_the_setting(leasing_settings):
    assert enqueue("t", "w").max_retries == 3
    leasing_settings(MAX_RETRIES=1)
    assert WorkItem.objects.get(pk=enqueue("t", "w").pk).max_retries == 1


def test_enqueue_many_is_one_insert_and_keeps_order():
    specs = [{"task_id": f"t{i}", "work_type": "w", "input_data": {"i": i}} for i in range(250)]
    with CaptureQueriesContext(connection) as queries:
        items = enqueue_many(specs)
    inserts = [q for q in queries.captured_queries if "INTO work_items" in q["sql"]]
    assert len(inserts) == 1
    assert [i.input_data["i"] for i in items] == list(range(250))
    assert WorkItem.objects.count() == 250
    # Same created_at within one statement; ids keep the enqueue order for claims.
    ordered = list(WorkItem.objects.claim_order().values_list("input_data__i", flat=True))
    assert ordered == list(range(250))


def test_enqueue_many_of_nothing_writes_nothing():
    assert enqueue_many([]) == []
    assert WorkItem.objects.count() == 0


def test_run_after_is_stored():
    when = datetime(2030, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
    item = enqueue("t", "w", run_after=when)
    assert WorkItem.objects.get(pk=item.pk).run_after == when
    assert not WorkItem.objects.claimable().exists()
    assert WorkItem.objects.deferred().count() == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"task_id": ""}, InvalidInput, "task_id must be a non-empty string"),
        ({"task_id": None}, InvalidInput, "task_id"),
        ({"work_type": "  "}, InvalidInput, "work_type"),
        ({"input_data": {"when": datetime.now(UTC)}}, PayloadNotSerializable, "JSON"),
        ({"input_data": {1, 2}}, PayloadNotSerializable, "JSON"),
        ({"input_data": float("nan")}, PayloadNotSerializable, "JSON"),
        ({"input_data": "x" * 2000}, PayloadTooLarge, "over the limit of 1000 bytes"),
        ({"priority": "high"}, InvalidInput, "priority must be an integer"),
        ({"priority": 2**31}, InvalidInput, "priority must be at most"),
        ({"max_retries": -1}, InvalidInput, "max_retries must be at least 0"),
        ({"max_retries": True}, InvalidInput, "max_retries must be an integer"),
        ({"run_after": "tomorrow"}, InvalidInput, "run_after must be a datetime"),
        ({"run_after": datetime(2030, 1, 1)}, InvalidInput, "timezone-aware"),
        ({"queue_name": ""}, InvalidInput, "queue_name"),
    ],
)
def test_bad_input_gets_a_specific_error_and_inserts_nothing(
    leasing_settings, kwargs, error, message
):
    leasing_settings(MAX_PAYLOAD_BYTES=1000)
    args = {"task_id": "t", "work_type": "w", **kwargs}
    with pytest.raises(error, match=message):
        enqueue(**args)
    assert WorkItem.objects.count() == 0


def test_one_bad_item_rejects_the_whole_batch():
    specs = [{"task_id": "t", "work_type": "w"}] * 3 + [{"task_id": "t", "work_type": ""}]
    with pytest.raises(InvalidInput, match="item 3"):
        enqueue_many(specs)
    with pytest.raises(InvalidInput, match="unknown keys"):
        enqueue_many([{"task_id": "t", "work_type": "w", "prio": 1}])
    with pytest.raises(InvalidInput, match="mapping"):
        enqueue_many(["not a mapping"])
    assert WorkItem.objects.count() == 0


def test_max_retries_defaults_to_the_handlers_option():
    from leasing.handlers import registry

    registry.register("test.picky", lambda ctx: None, max_retries=7)
    try:
        assert enqueue("t", "test.picky").max_retries == 7
        assert enqueue("t", "test.picky", max_retries=1).max_retries == 1
        [item] = enqueue_many([{"task_id": "t", "work_type": "test.picky"}])
        assert WorkItem.objects.get(pk=item.pk).max_retries == 7
    finally:
        registry.unregister("test.picky")
