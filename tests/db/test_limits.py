"""Global concurrency limits (LEASING QUEUE_LIMITS / WORK_TYPE_LIMITS) in the claim statement.

Single-process checks on both databases; `test_limits_concurrency.py` proves
the cap with real worker processes on PostgreSQL.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.test.utils import CaptureQueriesContext

from leasing import LeaseManager, enqueue_many
from leasing.conf import read_settings
from leasing.exceptions import LeasingConfigurationError
from leasing.services.completion import complete_and_claim
from leasing.services.terms import claim_terms
from leasing.sql.limits import Limits
from leasing.sql.terms import ClaimFilters

pytestmark = pytest.mark.django_db


def enqueue(n: int, queue: str, work_type: str = "test.noop", priority: int = 0) -> None:
    enqueue_many(
        [
            {
                "task_id": f"{queue}-{work_type}-{i}",
                "work_type": work_type,
                "queue_name": queue,
                "priority": priority,
            }
            for i in range(n)
        ]
    )


def by_queue(leases) -> Counter:
    return Counter(lease.queue_name for lease in leases)


def test_a_limited_queue_takes_no_more_than_its_room_and_the_batch_fills_with_other_work(
    leasing_settings,
):
    leasing_settings(QUEUE_LIMITS={"lim": 3})
    enqueue(10, "lim", priority=5)  # ahead of everything in claim order
    enqueue(10, "free")
    first = LeaseManager("w1").acquire_leases(10)
    assert by_queue(first) == {"lim": 3, "free": 7}
    second = LeaseManager("w2").acquire_leases(10)
    assert by_queue(second) == {"free": 3}  # lim is at its limit: no slot wasted on it
    lim = [lease for lease in first if lease.queue_name == "lim"]
    LeaseManager("w1").release_lease(lim[0].work_item_id, token=lim[0].token, success=True)
    third = LeaseManager("w3").acquire_leases(10)
    assert by_queue(third) == {"lim": 1}


def test_a_work_type_limit_counts_across_queues_and_overlaps_a_queue_limit(leasing_settings):
    leasing_settings(QUEUE_LIMITS={"lim": 4}, WORK_TYPE_LIMITS={"test.echo": 2})
    enqueue(5, "lim", "test.echo", priority=3)
    enqueue(5, "lim", "test.noop", priority=2)
    enqueue(5, "other", "test.echo", priority=1)
    enqueue(5, "other", "test.noop")
    leases = LeaseManager("w1").acquire_leases(20)
    pairs = Counter((lease.queue_name, lease.work_type) for lease in leases)
    assert sum(n for (q, _), n in pairs.items() if q == "lim") == 4
    assert sum(n for (_, t), n in pairs.items() if t == "test.echo") == 2
    assert pairs[("other", "test.noop")] == 5
    more = LeaseManager("w2").acquire_leases(20)
    assert not [lease for lease in more if lease.queue_name == "lim"]
    assert not [lease for lease in more if lease.work_type == "test.echo"]


def test_limits_hold_across_single_claims(leasing_settings):
    leasing_settings(WORK_TYPE_LIMITS={"test.noop": 2})
    enqueue(5, "default")
    manager = LeaseManager("w1")
    got = [manager.acquire_lease() for _ in range(4)]
    assert [lease is not None for lease in got] == [True, True, False, False]


def test_the_batch_path_complete_and_claim_respects_the_limit(leasing_settings):
    leasing_settings(QUEUE_LIMITS={"lim": 2})
    enqueue(6, "lim")
    manager = LeaseManager("w1")
    held = manager.acquire_leases(10)
    assert len(held) == 2
    completion, claimed = complete_and_claim(
        manager, [(held[0], None)], 10, claim_terms(None), ClaimFilters()
    )
    assert len(completion.completed) == 1
    assert len(claimed) == 1  # one finished, so one slot: never 2 + 1


def test_a_claim_filtered_away_from_limited_keys_takes_no_lock_and_no_count(
    leasing_settings, is_postgres
):
    leasing_settings(QUEUE_LIMITS={"lim": 1}, WORK_TYPE_LIMITS={"test.echo": 1})
    enqueue(3, "free")
    with CaptureQueriesContext(connection) as queries:
        leases = LeaseManager("w1").acquire_leases(
            5, queue_filter="free", work_type_filter="test.noop"
        )
    assert len(leases) == 3
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    assert "pg_advisory_xact_lock" not in sql and "room" not in sql


def test_unlimited_settings_keep_the_plain_claim(leasing_settings):
    enqueue(2, "free")
    with CaptureQueriesContext(connection) as queries:
        LeaseManager("w1").acquire_leases(5)
    (claim,) = [q["sql"] for q in queries.captured_queries if "lease_token + 1" in q["sql"]]
    assert "pg_advisory" not in claim and "room" not in claim


def test_a_limited_claim_on_postgres_takes_the_advisory_lock_first(leasing_settings, is_postgres):
    if not is_postgres:
        pytest.skip("advisory locks are PostgreSQL's")
    leasing_settings(QUEUE_LIMITS={"lim": 1})
    enqueue(1, "lim")
    with CaptureQueriesContext(connection) as queries:
        LeaseManager("w1").acquire_leases(5)
    sql = [q["sql"] for q in queries.captured_queries]
    lock = next(i for i, s in enumerate(sql) if "pg_advisory_xact_lock" in s)
    claim = next(i for i, s in enumerate(sql) if "lease_token + 1" in s)
    assert lock < claim


def test_limits_for_a_claim_follow_its_filters():
    limits = {"a": 1, "b": 2}
    types = {"t": 3}
    assert Limits.for_claim(limits, types, None, None) == Limits((("a", 1), ("b", 2)), (("t", 3),))
    assert Limits.for_claim(limits, types, ("b", "c"), ("u",)) == Limits((("b", 2),), ())
    assert not Limits.for_claim({}, {}, None, None)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"QUEUE_LIMITS": {"q": 0}},
            r"LEASING\['QUEUE_LIMITS'\]\['q'\] must be a positive integer",
        ),
        ({"QUEUE_LIMITS": {"q": -2}}, "must be a positive integer"),
        ({"QUEUE_LIMITS": {"q": 1.5}}, "must be a positive integer"),
        ({"QUEUE_LIMITS": {"q": True}}, "must be a positive integer"),
        ({"WORK_TYPE_LIMITS": {3: 1}}, "keys must be non-empty strings"),
        ({"WORK_TYPE_LIMITS": {"": 1}}, "keys must be non-empty strings"),
        ({"WORK_TYPE_LIMITS": [("t", 1)]}, "must be a dict"),
    ],
)
def test_bad_limit_settings_are_refused_and_reported_by_the_system_check(value, message, settings):
    [problem] = read_settings(value)[1]
    assert re.search(message, problem.message)
    assert isinstance(problem.error(), LeasingConfigurationError)
    settings.LEASING = {**settings.LEASING, **value}
    errors = [m for m in run_checks() if m.id == "leasing.E001"]
    assert len(errors) == 1 and "LIMITS" in errors[0].msg
