"""enqueue() and enqueue_many(): validation first, then one INSERT."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection, transaction
from django.db.models import signals
from django.test.utils import CaptureQueriesContext

from leasing import enqueue, enqueue_many
from leasing.exceptions import InvalidInput, PayloadNotSerializable, PayloadTooLarge
from leasing.models import WorkItem
from tests.support.helpers import database_now

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


def _cycle() -> dict:
    cyclic: dict = {}
    cyclic["self"] = [cyclic]
    return cyclic


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"task_id": ""}, InvalidInput, "task_id must be a non-empty string"),
        ({"task_id": None}, InvalidInput, "task_id"),
        ({"work_type": "  "}, InvalidInput, "work_type"),
        ({"input_data": {"when": datetime.now(UTC)}}, PayloadNotSerializable, "JSON"),
        ({"input_data": {1, 2}}, PayloadNotSerializable, "JSON"),
        ({"input_data": float("nan")}, PayloadNotSerializable, "JSON"),
        ({"input_data": _cycle()}, PayloadNotSerializable, "nested more than 100 levels"),
        ({"input_data": {"a": "\ud800"}}, PayloadNotSerializable, "lone surrogate"),
        ({"input_data": "x" * 2000}, PayloadTooLarge, "over the limit of 1000 bytes"),
        ({"priority": "high"}, InvalidInput, "priority must be an integer"),
        ({"priority": 2**31}, InvalidInput, "priority must be at most"),
        ({"max_retries": -1}, InvalidInput, "max_retries must be at least 0"),
        ({"max_retries": True}, InvalidInput, "max_retries must be an integer"),
        ({"run_after": "tomorrow"}, InvalidInput, "run_after must be a datetime"),
        ({"run_after": datetime(2030, 1, 1)}, InvalidInput, "timezone-aware"),
        # In UTC, beyond what a datetime holds: PostgreSQL stored it, and the admin's list
        # could no longer read the row (a 500 on every page that showed it).
        (
            {"run_after": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))},
            InvalidInput,
            "out of range",
        ),
        (
            {"run_after": datetime.min.replace(tzinfo=timezone(timedelta(hours=14)))},
            InvalidInput,
            "out of range",
        ),
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


# A large plain batch on PostgreSQL is validated while its COPY runs
# (`services.enqueue._copy_while_validating`): a bad item aborts a COPY that
# has already sent the items before it, and still nothing may be written.
LARGE = 2_500  # over sql.new_items.COPY_THRESHOLD


def _large(bad_at: int | None = None, bad: object = None) -> list:
    specs: list = [
        {"task_id": f"t{i}", "work_type": "w", "input_data": {"i": i}} for i in range(LARGE)
    ]
    if bad_at is not None:
        specs[bad_at] = bad
    return specs


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ({"task_id": "t", "work_type": "w", "priority": "high"}, InvalidInput, "priority"),
        ({"task_id": "t", "work_type": "w", "input_data": {1, 2}}, PayloadNotSerializable, "JSON"),
        (
            {"task_id": "t", "work_type": "w", "run_after": datetime(2030, 1, 1)},
            InvalidInput,
            "aware",
        ),
        ("not a mapping", InvalidInput, "must be a mapping"),
        ({"task_id": "t", "work_type": "w", "prio": 1}, InvalidInput, "unknown keys"),
    ],
)
def test_a_bad_item_late_in_a_large_batch_aborts_the_copy_and_writes_nothing(
    monkeypatch, bad, error, message
):
    from psycopg import pq

    from leasing.services import enqueue as service

    states = []
    validate = service._validate

    def spy(*args, **kwargs):
        states.append(connection.connection.pgconn.transaction_status)
        return validate(*args, **kwargs)

    monkeypatch.setattr(service, "_validate", spy)
    with pytest.raises(error, match=f"item {LARGE - 10}.*{message}"):
        enqueue_many(_large(LARGE - 10, bad))
    assert WorkItem.objects.count() == 0
    # The items were checked while the COPY ran (the connection busy with it).
    assert states[-1] == pq.TransactionStatus.ACTIVE, states[-5:]
    # The connection is usable afterwards, and the same items go in once fixed.
    items = enqueue_many(_large())
    assert [i.input_data["i"] for i in items] == list(range(LARGE))
    stored = dict(WorkItem.objects.values_list("work_item_id", "created_at"))
    assert len(stored) == LARGE
    assert all(stored[i.pk] == i.created_at for i in items)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_aborted_large_batch_inside_a_callers_transaction_leaves_the_rest_of_it():
    with transaction.atomic():
        before = enqueue("before", "w")
        with pytest.raises(InvalidInput, match=f"item {LARGE - 1}"):
            enqueue_many(_large(LARGE - 1, {"task_id": "", "work_type": "w"}))
        after = enqueue("after", "w")
    assert set(WorkItem.objects.values_list("pk", flat=True)) == {before.pk, after.pk}


@pytest.mark.postgres
def test_a_large_batch_with_rules_is_validated_before_it_is_written():
    # A unique key anywhere sends the batch down the rules path, checked in full first.
    specs = _large()
    specs[5] = {"task_id": "t5", "work_type": "w", "unique_key": "k"}
    specs[LARGE - 1] = {"task_id": "t", "work_type": "w", "priority": "high"}
    with pytest.raises(InvalidInput, match=f"item {LARGE - 1}"):
        enqueue_many(specs)
    assert WorkItem.objects.count() == 0


def _listening():
    """A psycopg connection of its own, LISTENing to the enqueue channel."""
    import psycopg

    from leasing.sql.new_items import NOTIFY_CHANNEL
    from tests.support.helpers import database_url

    listener = psycopg.connect(database_url(), autocommit=True)
    listener.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
    return listener


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_plain_batch_is_one_statement_that_commits_and_wakes_each_queue_once(db):
    specs = [
        {"task_id": f"t{i}", "work_type": "w", "queue_name": ("a", "b")[i % 2]} for i in range(10)
    ]
    with _listening() as listener:
        with CaptureQueriesContext(connection) as queries:
            enqueue_many(specs)
        # Committed when it returns: another connection sees every row at once.
        seen = listener.execute("SELECT count(*) FROM work_items").fetchone()[0]
        payloads = sorted(n.payload for n in listener.notifies(timeout=0.5))
    assert [q["sql"].split()[0] for q in queries.captured_queries] == ["WITH"]
    assert seen == 10
    assert payloads == ["a", "b"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_batch_in_a_callers_rolled_back_transaction_wakes_nobody(db):
    with _listening() as listener:
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue_many([{"task_id": "t", "work_type": "w", "queue_name": "q"}])
            # Not committed yet: invisible to others, and no NOTIFY delivered.
            assert listener.execute("SELECT count(*) FROM work_items").fetchone()[0] == 0
            assert list(listener.notifies(timeout=0.2)) == []
            raise RuntimeError("the caller's transaction rolls back")
        assert list(listener.notifies(timeout=0.3)) == []
    assert WorkItem.objects.count() == 0


@pytest.mark.parametrize("size", [3, LARGE])
@pytest.mark.parametrize("receiver", [False, True], ids=["built-directly", "post_init-receiver"])
def test_the_returned_items_are_the_stored_rows_whoever_listens_to_their_init(size, receiver):
    """Without init receivers the items are built from a ready __dict__ (for a large
    batch while its COPY runs); with one, through Model.__init__, which sends it."""
    seen = []

    def on_init(sender, instance, **kwargs):
        seen.append(instance.work_item_id)

    if receiver:
        signals.post_init.connect(on_init, sender=WorkItem)
    try:
        items = enqueue_many(_large()[:size])
    finally:
        signals.post_init.disconnect(on_init, sender=WorkItem)
    assert seen == ([i.pk for i in items] if receiver else [])
    fields = [f.attname for f in WorkItem._meta.concrete_fields]
    stored = {row.pk: row for row in WorkItem.objects.all()}
    assert len(stored) == size
    for item in items:
        assert item._state.adding is False and item._state.db == "default"
        row = stored[item.pk]
        assert {f: getattr(item, f) for f in fields} == {f: getattr(row, f) for f in fields}
