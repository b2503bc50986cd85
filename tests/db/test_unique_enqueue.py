"""Unique enqueue: a held key returns its holder instead of inserting (SQLite and PostgreSQL)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from leasing import LeaseManager, enqueue, enqueue_many
from leasing.exceptions import InvalidDuration, InvalidInput
from leasing.models import WorkItem

pytestmark = pytest.mark.django_db


def rows(key: str) -> list[WorkItem]:
    return list(WorkItem.objects.filter(unique_key=key).order_by("created_at", "work_item_id"))


def claim(item: WorkItem) -> LeaseManager:
    manager = LeaseManager("w1")
    lease = manager.acquire_lease(60, task_id_filter=item.task_id)
    assert lease is not None and lease.work_item_id == item.work_item_id
    return manager


# --- the scopes -------------------------------------------------------------------------------


def test_a_pending_key_returns_the_pending_item_and_says_so():
    first = enqueue("t1", "w", {"n": 1}, unique_key="report:42", unique_while="pending")
    again = enqueue("t2", "w", {"n": 2}, unique_key="report:42", unique_while="pending")
    assert first.duplicate is False
    assert again.duplicate is True
    assert again.work_item_id == first.work_item_id
    # The holder as it is, not the arguments of the duplicate enqueue.
    assert (again.task_id, again.input_data, again.status) == ("t1", {"n": 1}, "pending")
    assert [r.work_item_id for r in rows("report:42")] == [first.work_item_id]
    stored = WorkItem.objects.get(pk=first.pk)
    assert (stored.unique_key, stored.unique_scope, stored.unique_until) == (
        "report:42",
        "pending",
        None,
    )


def test_a_pending_key_is_free_again_once_its_item_is_claimed():
    first = enqueue("t1", "w", unique_key="k", unique_while="pending")
    claim(first)
    second = enqueue("t1", "w", unique_key="k", unique_while="pending")
    assert second.duplicate is False and second.work_item_id != first.work_item_id
    # ... and the new pending item holds it now.
    third = enqueue("t1", "w", unique_key="k", unique_while="pending")
    assert third.duplicate is True and third.work_item_id == second.work_item_id
    assert len(rows("k")) == 2


def test_an_unfinished_key_is_held_while_in_progress_and_freed_by_the_end():
    first = enqueue("t1", "w", unique_key="k")  # "unfinished" is the default scope
    assert WorkItem.objects.get(pk=first.pk).unique_scope == "unfinished"
    manager = claim(first)
    during = enqueue("t1", "w", unique_key="k", unique_while="unfinished")
    assert during.duplicate is True and during.work_item_id == first.work_item_id
    assert during.status == "in_progress"
    manager.release_lease(first.work_item_id, success=True)
    after = enqueue("t1", "w", unique_key="k", unique_while="unfinished")
    assert after.duplicate is False and after.work_item_id != first.work_item_id


def test_a_failed_item_no_longer_holds_an_unfinished_key():
    first = enqueue("t1", "w", unique_key="k", max_retries=0)
    manager = claim(first)
    manager.release_lease(first.work_item_id, success=False, error="boom")
    assert WorkItem.objects.get(pk=first.pk).status == "failed"
    assert enqueue("t1", "w", unique_key="k").duplicate is False


def test_a_period_key_is_held_after_completion_until_the_period_ends():
    first = enqueue("t1", "w", unique_key="digest", unique_while=timedelta(seconds=1))
    stored = WorkItem.objects.get(pk=first.pk)
    assert stored.unique_scope == "period"
    assert stored.unique_until - stored.created_at == timedelta(seconds=1)
    manager = claim(first)
    manager.release_lease(first.work_item_id, success=True)
    again = enqueue("t2", "w", unique_key="digest", unique_while=timedelta(seconds=1))
    assert again.duplicate is True and again.work_item_id == first.work_item_id
    assert again.status == "completed"
    time.sleep(1.05)
    later = enqueue("t3", "w", unique_key="digest", unique_while=timedelta(seconds=1))
    assert later.duplicate is False and later.task_id == "t3"
    assert len(rows("digest")) == 2


def test_the_scope_is_part_of_the_key():
    a = enqueue("t", "w", unique_key="k", unique_while="pending")
    b = enqueue("t", "w", unique_key="k", unique_while="unfinished")
    c = enqueue("t", "w", unique_key="k", unique_while=timedelta(minutes=5))
    assert not (a.duplicate or b.duplicate or c.duplicate)
    assert len({a.pk, b.pk, c.pk}) == 3


def test_items_without_a_key_never_collide():
    a, b = enqueue("t", "w"), enqueue("t", "w")
    assert a.pk != b.pk and a.duplicate is False and b.duplicate is False


def test_the_database_refuses_a_second_holder_even_from_raw_sql():
    enqueue("t", "w", unique_key="k", unique_while="pending")
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO work_items (work_item_id, task_id, work_type, unique_key, unique_scope)"
            " VALUES ('X1', 't', 'w', 'k', 'pending')"
        )


# --- batches -----------------------------------------------------------------------------------


def test_a_mixed_batch_inserts_once_per_key_and_marks_duplicates():
    held = enqueue("old", "w", unique_key="held")
    items = enqueue_many(
        [
            {"task_id": "p1", "work_type": "w"},
            {"task_id": "u1", "work_type": "w", "unique_key": "new"},
            {"task_id": "p2", "work_type": "w"},
            {"task_id": "u2", "work_type": "w", "unique_key": "new"},
            {"task_id": "u3", "work_type": "w", "unique_key": "held"},
            {"task_id": "u4", "work_type": "w", "unique_key": "new", "unique_while": "pending"},
        ]
    )
    assert [i.duplicate for i in items] == [False, False, False, True, True, False]
    assert items[3].work_item_id == items[1].work_item_id and items[3].task_id == "u1"
    assert items[4].work_item_id == held.work_item_id and items[4].task_id == "old"
    # Distinct instances: marking one a duplicate does not touch the other.
    assert items[1] is not items[3] and items[1].duplicate is False
    assert WorkItem.objects.count() == 1 + 4
    assert sorted(WorkItem.objects.values_list("task_id", flat=True)) == [
        "old",
        "p1",
        "p2",
        "u1",
        "u4",
    ]


def test_a_batch_with_keys_is_one_insert_statement():
    enqueue("old", "w", unique_key="k0")
    specs = [{"task_id": f"t{i}", "work_type": "w", "unique_key": f"k{i % 5}"} for i in range(50)]
    with CaptureQueriesContext(connection) as queries:
        items = enqueue_many(specs)
    inserts = [q for q in queries.captured_queries if "INSERT INTO work_items" in q["sql"]]
    assert len(inserts) == 1
    assert "ON CONFLICT" in inserts[0]["sql"]
    assert sum(not i.duplicate for i in items) == 4  # k1..k4; k0 was held already
    assert WorkItem.objects.count() == 5


def test_plain_batches_keep_their_statement():
    with CaptureQueriesContext(connection) as queries:
        items = enqueue_many([{"task_id": "t", "work_type": "w"}] * 3)
    assert all(i.duplicate is False for i in items)
    assert not any("ON CONFLICT" in q["sql"] for q in queries.captured_queries)


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"unique_key": ""}, InvalidInput, "unique_key must be a non-empty string"),
        ({"unique_key": "   "}, InvalidInput, "unique_key must be a non-empty string"),
        ({"unique_key": 42}, InvalidInput, "unique_key must be a non-empty string"),
        ({"unique_key": "k" * 256}, InvalidInput, "unique_key must be at most 255"),
        ({"unique_key": "a\x00b"}, InvalidInput, "unique_key must not contain NUL"),
        ({"unique_key": "a\ud800"}, InvalidInput, "lone surrogate"),
        ({"unique_while": "pending"}, InvalidInput, "unique_while needs a unique_key"),
        ({"unique_key": "k", "unique_while": "period"}, InvalidInput, "or a timedelta"),
        ({"unique_key": "k", "unique_while": "forever"}, InvalidInput, "or a timedelta"),
        ({"unique_key": "k", "unique_while": 60}, InvalidInput, "or a timedelta"),
        ({"unique_key": "k", "unique_while": timedelta(0)}, InvalidDuration, "positive"),
        ({"unique_key": "k", "unique_while": timedelta(seconds=-1)}, InvalidDuration, "positive"),
        ({"unique_key": "k", "unique_while": timedelta(days=5000)}, InvalidDuration, "at most"),
    ],
)
def test_bad_unique_arguments_are_refused_and_nothing_is_written(kwargs, error, message):
    with pytest.raises(error, match=message):
        enqueue("t", "w", **kwargs)
    with pytest.raises(error, match=f"item 1: .*{message}"):
        enqueue_many(
            [{"task_id": "ok", "work_type": "w"}, {"task_id": "t", "work_type": "w", **kwargs}]
        )
    assert WorkItem.objects.count() == 0


def test_a_key_of_255_characters_is_fine():
    key = "k" * 255
    assert enqueue("t", "w", unique_key=key).duplicate is False
    assert enqueue("t", "w", unique_key=key).duplicate is True


# --- the race, with real processes -----------------------------------------------------------
