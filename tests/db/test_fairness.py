"""Fair claims (LEASING FAIR_QUEUES, FAIRNESS_WEIGHTS): claims take turns across fairness keys.

Single-process checks on both databases; the bench scenario `bench/fairness.py`
measures a tenant's start latency behind another's 200,000-item backlog.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection, transaction

from leasing import LeaseManager, enqueue, enqueue_many, pause
from leasing.models import WorkItem
from leasing.sql.candidates import where
from leasing.sql.fairness import Fairness, fair_candidates
from leasing.sql.limits import Limits
from leasing.sql.terms import ClaimFilters
from leasing.storage import storage_for

pytestmark = pytest.mark.django_db


def backlog(key: str | None, n: int, *, queue: str = "fair", priority: int = 0) -> None:
    enqueue_many(
        [
            {
                "task_id": f"{key}-{i}",
                "work_type": "test.noop",
                "queue_name": queue,
                "fairness_key": key,
                "priority": priority,
            }
            for i in range(n)
        ]
    )


def keys_of(leases) -> Counter:
    return Counter(WorkItem.objects.get(pk=lease.work_item_id).fairness_key for lease in leases)


def test_a_tenant_behind_another_s_backlog_gets_its_turn_in_the_next_claim(leasing_settings):
    leasing_settings(FAIR_QUEUES=["fair"])
    backlog("a", 200, priority=5)  # first in claim order, and of higher priority
    backlog("b", 3)
    assert keys_of(LeaseManager("w1").acquire_leases(4)) == {"a": 2, "b": 2}


def test_without_fair_queues_the_backlog_comes_first(leasing_settings):
    backlog("a", 200)
    backlog("b", 3)
    assert keys_of(LeaseManager("w1").acquire_leases(4)) == {"a": 4}


def test_claims_rotate_so_every_key_is_served_within_keys_over_batch_claims(leasing_settings):
    leasing_settings(FAIR_QUEUES=["fair"])
    names = [f"t{i:02d}" for i in range(10)]
    for name in names:
        backlog(name, 5)
    manager = LeaseManager("w1")
    served = Counter()
    for _ in range(4):  # ceil(10 keys / 3 a claim)
        served += keys_of(manager.acquire_leases(3))
    assert set(served) == set(names)
    assert max(served.values()) - min(served.values()) <= 1


def test_weights_give_a_key_more_turns(leasing_settings):
    leasing_settings(FAIR_QUEUES=["fair"], FAIRNESS_WEIGHTS={"gold": 3})
    backlog("gold", 50)
    backlog("silver", 50)
    assert keys_of(LeaseManager("w1").acquire_leases(8)) == {"gold": 6, "silver": 2}


def test_items_without_a_key_and_other_queues_take_turns_too(leasing_settings):
    leasing_settings(FAIR_QUEUES=["fair"])
    backlog("a", 50)
    backlog(None, 5)
    backlog(None, 5, queue="plain")
    leases = LeaseManager("w1").acquire_leases(6)
    assert Counter(
        (lease.queue_name, k)
        for lease, k in zip(
            leases,
            [WorkItem.objects.get(pk=x.work_item_id).fairness_key for x in leases],
            strict=True,
        )
    ) == {("fair", "a"): 2, ("fair", None): 2, ("plain", None): 2}


def test_fair_claims_honour_pauses_and_concurrency_limits(leasing_settings):
    leasing_settings(FAIR_QUEUES=["fair", "held"], QUEUE_LIMITS={"fair": 3})
    backlog("a", 10)
    backlog("b", 10)
    backlog("c", 10, queue="held")
    pause(queue="held", by="test", reason="test")
    leases = LeaseManager("w1").acquire_leases(10)
    assert len(leases) == 3
    assert {lease.queue_name for lease in leases} == {"fair"}
    assert LeaseManager("w2").acquire_leases(10) == []


def test_fair_claims_under_a_rate_limit(leasing_settings):
    leasing_settings(
        FAIR_QUEUES=["fair"], RATE_LIMITS={"key:*": {"limit": 1, "per": 60, "burst": 2}}
    )
    enqueue_many(
        [
            {
                "task_id": f"{k}-{i}",
                "work_type": "test.noop",
                "queue_name": "fair",
                "fairness_key": k,
                "rate_key": k,
            }
            for k in ("a", "b")
            for i in range(10)
        ]
    )
    assert keys_of(LeaseManager("w1").acquire_leases(10)) == {"a": 2, "b": 2}


def test_an_enqueue_checks_its_fairness_key(leasing_settings):
    from leasing.exceptions import InvalidInput

    with pytest.raises(InvalidInput, match="fairness_key"):
        enqueue("t", "test.noop", fairness_key=" ")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plans")
def test_the_fair_claim_reads_indexes_only_however_deep_the_backlog(leasing_settings):
    backlog("a", 3000)
    backlog("b", 5)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE work_items")
    d = storage_for("default")
    filters = ClaimFilters(queues=("fair",))
    condition, params = where(d, filters)
    fairness = Fairness(queues=(("fair", ""),))
    ctes, all_params = fair_candidates(d, condition, params, 10, fairness, Limits())
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off")
        cursor.execute(
            f"EXPLAIN (ANALYZE, FORMAT TEXT) WITH {ctes} SELECT * FROM candidate", all_params
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Seq Scan on work_items" not in plan, plan
    assert "work_items_fair_idx" in plan, plan


def test_completing_and_claiming_in_one_statement_takes_turns_too(leasing_settings):
    from leasing.services.completion import complete_and_claim
    from leasing.services.terms import claim_terms

    leasing_settings(FAIR_QUEUES=["fair"])
    backlog("a", 100)
    manager = LeaseManager("w1")
    first = manager.acquire_leases(2)
    backlog("b", 5)
    completion, leases = complete_and_claim(
        manager, [(lease, None) for lease in first], 4, claim_terms(None), ClaimFilters()
    )
    assert len(completion.completed) == 2
    assert keys_of(leases) == {"a": 2, "b": 2}
    # The rotation ran from the cursor ("a", served first): "b", then around to "a",
    # the last key served, where the next claim starts after.
    assert manager.fair_cursors == {"fair": "a"}


@pytest.mark.postgres  # row locks: SQLite has one writer at a time
@pytest.mark.django_db(transaction=True)
def test_a_lone_keys_claim_leaves_every_item_it_did_not_take_to_other_claimers(
    leasing_settings,
):
    # A claim reads a key's share of rows FOR UPDATE; rows it reads but does not
    # claim stay locked till its transaction ends, and other claimers skip them.
    # With one key its share is the claim itself, so nothing beside it is held.
    import threading

    from django.db import connections

    leasing_settings(FAIR_QUEUES=["fair"])
    backlog("a", 20)
    other: list[int] = []

    def claim_the_rest() -> None:
        try:
            other.append(len(LeaseManager("w2").acquire_leases(20)))
        finally:
            connections.close_all()

    with transaction.atomic():
        assert len(LeaseManager("w1").acquire_leases(5)) == 5
        thread = threading.Thread(target=claim_the_rest)
        thread.start()
        thread.join(timeout=30)
    assert other == [15]
