"""Concurrency limits, rate limits and pauses where they meet operator actions, hand-backs,
abandoned runs and settings the check accepts.

Single-process checks on both databases (`tests/db/test_limits.py`,
`test_rate_limits.py` and `test_pauses.py` hold each gate alone).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from leasing import LeaseManager, apply_action, cancel, enqueue_many, pause, resume
from leasing.models import RateBucket, WorkItem
from leasing.services.completion import complete_and_claim
from leasing.services.terms import claim_terms
from leasing.sql import limits as limits_sql
from leasing.sql.terms import ClaimFilters

pytestmark = pytest.mark.django_db

# One at once, then one a minute: nothing more within a test.
ONE_A_MINUTE = {"limit": 1, "per": 60, "burst": 1}
ONE_A_DAY = {"limit": 1, "per": 86400, "burst": 1}
ODD_NAMES = ["mail out", "письма ✉", "q" * 200, "a:b%s"]


def enqueue(n: int, queue: str, work_type: str = "test.noop", **extra) -> list[str]:
    return [
        r.work_item_id
        for r in enqueue_many(
            [
                {
                    "task_id": f"{queue}-{work_type}-{extra.get('priority', 0)}-{i}",
                    "work_type": work_type,
                    "queue_name": queue,
                    **extra,
                }
                for i in range(n)
            ]
        )
    ]


def by_queue(leases) -> Counter:
    return Counter(lease.queue_name for lease in leases)


def status(item_id: str) -> str:
    return WorkItem.objects.get(pk=item_id).status


# --- many limits: what the check accepts must not stop claims --------------------------


def test_many_limits_the_check_accepts_still_claim_and_hold_each_limit(leasing_settings):
    # 30 queue and 20 work type limits: 651 cells. SQLite used to refuse the claim
    # ("too many terms in compound SELECT"), so no worker claimed anything, in any queue;
    # 100 and 100 took a PostgreSQL server's planner past its memory.
    leasing_settings(
        QUEUE_LIMITS={f"q{i}": 2 for i in range(30)},
        WORK_TYPE_LIMITS={f"t{i}": 1 for i in range(20)},
    )
    enqueue(3, "free")
    enqueue(3, "q1")
    enqueue(3, "other", "t5")
    with CaptureQueriesContext(connection) as queries:
        leases = LeaseManager("w1").acquire_leases(20)
    # One count per limit and a bounded walk, not a branch per (queue, type) pair.
    claim = max((q["sql"] for q in queries.captured_queries), key=len)
    assert claim.count("FROM work_items") <= 30 + 20 + 5
    assert Counter((lease.queue_name, lease.work_type) for lease in leases) == {
        ("free", "test.noop"): 3,
        ("q1", "test.noop"): 2,
        ("other", "t5"): 1,
    }
    assert LeaseManager("w2").acquire_leases(20) == []


def test_more_limits_than_a_compound_select_holds_still_claim(leasing_settings):
    # 600 queue limits: the counts of their rooms were one UNION of 600 terms (SQLite's
    # bound is 500).
    leasing_settings(QUEUE_LIMITS={f"q{i}": 1 for i in range(600)})
    enqueue(2, "q599")
    enqueue(2, "free")
    assert by_queue(LeaseManager("w1").acquire_leases(10)) == {"q599": 1, "free": 2}


def test_many_limits_share_a_bounded_number_of_locks_and_each_key_always_the_same_one():
    # One advisory lock per key took 600 slots of PostgreSQL's shared lock table per
    # claim (6,400 by default for the whole server): a few workers claiming at once
    # would fill it and fail every transaction on the server.
    queues = {f"q{i}": 1 for i in range(600)}
    everything = limits_sql.Limits.for_claim(queues, {"t": 1}, None, None)
    assert len(everything.lock_keys()) <= limits_sql.LOCK_SLOTS
    for name in ("q5", "q599"):
        one = limits_sql.Limits.for_claim(queues, {"t": 1}, (name,), ("u",))
        assert len(one.lock_keys()) == 1 and set(one.lock_keys()) <= set(everything.lock_keys())
    few = limits_sql.Limits.for_claim({"a": 1}, {"t": 1}, None, None)
    assert few.lock_keys() == ["queue:a", "work_type:t"]  # a lock of its own each


def test_with_many_limits_a_full_key_costs_the_claim_no_slots(leasing_settings):
    leasing_settings(QUEUE_LIMITS={f"q{i}": 1 for i in range(limits_sql.MAX_CELLS)})
    enqueue(1, "q0")
    assert by_queue(LeaseManager("w1").acquire_leases(5)) == {"q0": 1}
    enqueue(10, "q0", priority=9)  # ahead of everything, but q0 is full
    enqueue(1, "q1", priority=5)
    enqueue(3, "free")
    assert by_queue(LeaseManager("w2").acquire_leases(4)) == {"q1": 1, "free": 3}
    assert by_queue(LeaseManager("w3").acquire_leases(4)) == {}


# --- force-release and abandoned runs -------------------------------------------------


def test_a_force_released_run_no_longer_counts_against_its_limit(leasing_settings):
    # Documented (limits.md): the limit counts claimed rows; a force-released run whose
    # thread still runs is not one, so the queue's room comes back at once.
    leasing_settings(QUEUE_LIMITS={"lim": 1})
    enqueue(2, "lim")
    [held] = LeaseManager("w1").acquire_leases(5)
    assert LeaseManager("w2").acquire_leases(5) == []
    result = apply_action(
        "force_release", held.work_item_id, expected_token=held.token, actor="op", reason="hung"
    )
    assert result.applied and result.new_status == "pending"
    [again] = LeaseManager("w2").acquire_leases(5)
    assert again.queue_name == "lim"


# --- rate limits and hand-backs -------------------------------------------------------


@pytest.mark.parametrize("how", ["hand_back", "force_release"])
def test_a_claim_given_back_keeps_its_charge_and_the_item_waits_for_its_bucket(
    leasing_settings, how
):
    leasing_settings(RATE_LIMITS={"key:api": ONE_A_MINUTE})
    [item_id] = enqueue(1, "default", rate_key="api")
    manager = LeaseManager("w1")
    [lease] = manager.acquire_leases(5)
    if how == "hand_back":
        manager.requeue_lease(lease.work_item_id, token=lease.token)
    else:
        apply_action(
            "force_release", item_id, expected_token=lease.token, actor="op", reason="stuck"
        )
    row = WorkItem.objects.get(pk=item_id)
    assert (row.status, row.retry_count) == ("pending", 0)
    # No refund: the bucket admitted one and stays closed, so the item waits its turn.
    assert LeaseManager("w2").acquire_leases(5) == []
    assert RateBucket.objects.get(bucket="key:api").admitted == 1


# --- cancelling what a gate holds back --------------------------------------------------


def test_an_item_held_back_by_a_pause_a_limit_or_a_rate_is_cancelled_at_once(leasing_settings):
    leasing_settings(QUEUE_LIMITS={"lim": 1}, RATE_LIMITS={"key:api": ONE_A_MINUTE})
    paused = enqueue(1, "paused")
    limited = enqueue(2, "lim")
    rated = enqueue(2, "rated", rate_key="api")
    pause(queue="paused", by="op", reason="outage")
    leases = LeaseManager("w1").acquire_leases(10)
    assert by_queue(leases) == {"lim": 1, "rated": 1}
    waiting = [paused[0], *(i for i in limited + rated if status(i) == "pending")]
    assert len(waiting) == 3
    for item_id in waiting:
        result = cancel(item_id, actor="op", reason="not wanted")
        assert (result.applied, result.new_status) == (True, "cancelled")
    resume(queue="paused", by="op", reason="back")
    assert LeaseManager("w2").acquire_leases(10) == []


# --- odd names ------------------------------------------------------------------------


def test_limits_rates_and_pauses_of_odd_names_hold_and_other_queues_go_on(leasing_settings):
    leasing_settings(
        QUEUE_LIMITS=dict.fromkeys(ODD_NAMES, 1),
        RATE_LIMITS={f"queue:{name}": ONE_A_MINUTE for name in ODD_NAMES},
    )
    for name in ODD_NAMES:
        enqueue(2, name)
    enqueue(2, "free")
    pause(queue=ODD_NAMES[0], by="op", reason="odd")
    leases = LeaseManager("w1").acquire_leases(20)
    assert by_queue(leases) == {**dict.fromkeys(ODD_NAMES[1:], 1), "free": 2}
    assert LeaseManager("w2").acquire_leases(20) == []
    resume(queue=ODD_NAMES[0], by="op", reason="back")
    assert by_queue(LeaseManager("w2").acquire_leases(20)) == {ODD_NAMES[0]: 1}


# --- a limit changed while items run -------------------------------------------------


def test_a_limit_lowered_while_items_run_stops_claims_until_the_count_falls_under_it(
    leasing_settings,
):
    leasing_settings(QUEUE_LIMITS={"lim": 3})
    enqueue(6, "lim")
    enqueue(1, "free")
    manager = LeaseManager("w1")
    held = [lease for lease in manager.acquire_leases(10) if lease.queue_name == "lim"]
    assert len(held) == 3
    leasing_settings(QUEUE_LIMITS={"lim": 1})  # read again by the next claim
    for lease in held[:2]:
        assert LeaseManager("w2").acquire_leases(10) == []  # other queues go on meanwhile
        manager.release_lease(lease.work_item_id, token=lease.token, success=True)
    assert LeaseManager("w2").acquire_leases(10) == []  # one runs: the new limit
    manager.release_lease(held[2].work_item_id, token=held[2].token, success=True)
    assert by_queue(LeaseManager("w2").acquire_leases(10)) == {"lim": 1}


# --- a rate limit changed while a bucket is closed -----------------------------------


@pytest.mark.parametrize("change", ["raised", "removed"])
def test_a_rate_limit_raised_or_removed_opens_its_closed_bucket(leasing_settings, change):
    # A bucket closed under one a day stayed closed for the day after its setting was
    # raised or dropped: the claim's gate reads the bucket row's `next_at`, written
    # under the old limit.
    leasing_settings(RATE_LIMITS={"queue:slow": ONE_A_DAY, "key:other": "5/s"})
    enqueue(3, "slow")
    assert by_queue(LeaseManager("w1").acquire_leases(5)) == {"slow": 1}
    assert LeaseManager("w1").acquire_leases(5) == []
    new = {"queue:slow": "100/s"} if change == "raised" else {}
    leasing_settings(RATE_LIMITS={**new, "key:other": "5/s"})
    if change == "removed":
        assert by_queue(LeaseManager("w2").acquire_leases(5)) == {"slow": 2}
        return
    # Raised: open one interval (10 ms) after the change, then at the new rate.
    first = LeaseManager("w2").acquire_leases(5)  # settles the bucket: the new limit
    time.sleep(0.05)
    assert by_queue(first + LeaseManager("w2").acquire_leases(5)) == {"slow": 2}


def test_an_enqueue_that_raises_its_keys_limit_opens_its_closed_bucket(leasing_settings):
    leasing_settings(RATE_LIMITS={"key:*": None})
    enqueue(1, "default", rate_key="crm", rate_limit=ONE_A_DAY)
    assert len(LeaseManager("w1").acquire_leases(5)) == 1
    enqueue(2, "more", rate_key="crm", rate_limit="100/s")  # the latest one given wins
    time.sleep(0.05)  # open one interval (10 ms) after the change
    assert by_queue(LeaseManager("w2").acquire_leases(5)) == {"more": 2}


def test_many_limits_hold_in_the_batch_path_and_a_fair_claim(leasing_settings):
    leasing_settings(QUEUE_LIMITS={f"q{i}": 2 for i in range(600)}, FAIR_QUEUES=["fair"])
    enqueue(4, "q7")
    enqueue_many(
        [
            {
                "task_id": f"fair-{i}",
                "work_type": "test.noop",
                "queue_name": "fair",
                "fairness_key": f"k{i % 2}",
            }
            for i in range(4)
        ]
    )
    manager = LeaseManager("w1")
    held = manager.acquire_leases(10)
    assert by_queue(held) == {"q7": 2, "fair": 4}
    leasing_settings(FAIR_QUEUES=[])
    q7 = [lease for lease in held if lease.queue_name == "q7"]
    completion, claimed = complete_and_claim(
        manager, [(q7[0], None)], 10, claim_terms(None), ClaimFilters()
    )
    assert len(completion.completed) == 1
    assert by_queue(claimed) == {"q7": 1}  # one finished, so one slot
