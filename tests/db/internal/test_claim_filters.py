"""Claims filtered to some work types or queues: every item of them, none of the others.

On PostgreSQL the claim also checks the range of its types and queues on the
claim index's entries, so the items of other types or queues that come first
in claim order are skipped without reading their rows; a small claim filtered
to a few types reads one branch of the type-led claim index per type, so it
does not even walk the index entries of the others (`leasing.sql.candidates`).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from leasing import LeaseManager, enqueue, enqueue_many, pause
from leasing.models import WorkItem
from leasing.sql.candidates import MAX_BRANCHES, plain_candidates
from leasing.sql.terms import ClaimFilters
from leasing.storage import storage_for
from leasing.storage.postgres import CLAIM_PLANNER_OFF
from leasing.storage.postgres.claims import locked_candidates, type_branches
from tests.support.plans import work_item_scans

pytestmark = pytest.mark.django_db

# Orders that differ between code points and linguistic collations.
NAMES = ["Zeta", "alpha", "_x", "émile", "b-2", "B1"]


def test_a_claim_filtered_by_work_types_takes_all_of_them_and_nothing_else():
    for name in NAMES:
        enqueue(f"t-{name}", name)
    enqueue("t-other", "m-other", priority=9)  # first in claim order, not asked for
    leases = LeaseManager("w").acquire_leases(20, 60, work_type_filter=NAMES)
    assert sorted(lease.work_type for lease in leases) == sorted(NAMES)


def test_a_claim_filtered_by_queues_takes_all_of_them_and_nothing_else():
    for name in NAMES:
        enqueue(f"q-{name}", "job", queue_name=name)
    enqueue("q-other", "job", queue_name="m-other", priority=9)
    leases = LeaseManager("w").acquire_leases(20, 60, queue_filter=NAMES)
    assert sorted(lease.queue_name for lease in leases) == sorted(NAMES)


@pytest.mark.postgres
@pytest.mark.parametrize("column", ["work_type", "queue_name"])
def test_items_of_other_types_or_queues_ahead_in_claim_order_are_not_read(column):
    other, mine = {"work_type": ("zz.other", "aa.mine"), "queue_name": ("zz", "aa")}[column]
    ahead = {"work_type": "job", "priority": 5, column: other}
    enqueue_many([{"task_id": f"o{i}", **ahead} for i in range(2000)])
    item = enqueue("mine", **{"work_type": "job", column: mine})
    asked = {"work_type": "work_types", "queue_name": "queues"}[column]
    sql, params = plain_candidates(storage_for(), ClaimFilters(**{asked: (mine,)}), 1)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE work_items")
        for name in CLAIM_PLANNER_OFF:  # the claim's own settings (PostgresStorage.in_claim_order)
            cursor.execute(f"SET LOCAL {name} = off")
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0][0]["Plan"]
        cursor.execute(sql, params)
        assert cursor.fetchall() == [(item.pk,)]
    scans = work_item_scans(plan)
    assert [n.get("Index Name") for n in scans] == ["work_items_claim_idx"], plan
    # The 2,000 others were passed over on the index: one row read, none filtered out.
    assert column in scans[0]["Index Cond"], plan
    assert scans[0]["Actual Rows"] == 1 and scans[0].get("Rows Removed by Filter", 0) == 0, plan


def _claim_order_key(item: WorkItem) -> tuple:
    return (-item.priority, item.run_after or item.created_at, item.created_at, item.pk)


def test_a_claim_for_several_types_takes_the_first_items_in_claim_order_across_them():
    types = ("t.a", "t.b", "t.c")
    enqueue_many(
        [
            {"task_id": f"i{i}", "work_type": types[i % 3], "priority": (i * 7) % 5}
            for i in range(30)
        ]
    )
    enqueue("skipped", "t.other", priority=9)
    mine = WorkItem.objects.filter(work_type__in=types)
    expected = [item.pk for item in sorted(mine, key=_claim_order_key)]
    manager = LeaseManager("w")
    first = manager.acquire_leases(5, 60, work_type_filter=types)
    second = manager.acquire_leases(5, 60, work_type_filter=types)
    assert [lease.work_item_id for lease in first + second] == expected[:10]


def test_claims_filtered_to_a_few_work_types_can_branch():
    assert type_branches(ClaimFilters(work_types=("a", "b")))
    many = tuple(f"t{i}" for i in range(MAX_BRANCHES + 1))
    assert not type_branches(ClaimFilters(work_types=many))
    assert not type_branches(ClaimFilters(queues=("q",)))


def test_a_manager_branches_after_a_short_claim_and_walks_after_a_full_one():
    manager = LeaseManager("w")
    types = ("t.a", "t.b")
    filters = ClaimFilters(work_types=types)
    assert manager.shape.by_type(filters)  # a worker starts idle
    enqueue_many([{"task_id": f"i{i}", "work_type": "t.a"} for i in range(6)])
    assert len(manager.acquire_leases(4, 60, work_type_filter=types)) == 4
    assert not manager.shape.by_type(filters)  # full: its types have work in depth
    assert manager.shape.by_type(ClaimFilters(work_types=("t.c",)))  # other filters
    assert len(manager.acquire_leases(4, 60, work_type_filter=types)) == 2
    assert manager.shape.by_type(filters)  # short: the walk went to the end


def _explain_candidates(filters: ClaimFilters, n: int) -> tuple[dict, list[str]]:
    cte, params = locked_candidates(storage_for(), filters, n, by_type=True)
    sql = f"WITH {cte} SELECT work_item_id FROM candidate"
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE work_items")
        for name in CLAIM_PLANNER_OFF:  # the claim's own settings (PostgresStorage.in_claim_order)
            cursor.execute(f"SET LOCAL {name} = off")
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        explained = cursor.fetchone()[0][0]
    # Its sort is the only way to merge the branches: it costs the sort's
    # "disable cost", which must not get the claim JIT-compiled.
    assert "JIT" not in explained, explained
    return explained["Plan"], params


@pytest.mark.postgres
def test_a_branched_claim_reads_only_its_own_types_entries():
    # Between the two asked-for types in every collation, so the range check
    # of the plain walk would not skip them.
    enqueue_many([{"task_id": f"o{i}", "work_type": "m.other", "priority": 5} for i in range(2000)])
    low = enqueue("low", "a.mine", priority=1)
    high = enqueue("high", "z.mine", priority=2)
    filters = ClaimFilters(work_types=("a.mine", "z.mine"))
    plan, _ = _explain_candidates(filters, 2)
    scans = work_item_scans(plan)
    assert {n.get("Index Name") for n in scans} == {"work_items_claim_type_idx"}, plan
    # Two branches of one entry each: none of the 2,000 others is read.
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in scans) == 2, plan
    assert all(n.get("Rows Removed by Filter", 0) == 0 for n in scans), plan
    leases = LeaseManager("w").acquire_leases(2, 60, work_type_filter=filters.work_types)
    assert [lease.work_item_id for lease in leases] == [high.pk, low.pk]


@pytest.mark.postgres
def test_a_branched_claim_never_walks_a_paused_types_backlog():
    enqueue_many([{"task_id": f"p{i}", "work_type": "b.paused"} for i in range(500)])
    mine = enqueue("mine", "a.mine")
    pause(work_type="b.paused", by="ops", reason="test")
    plan, _ = _explain_candidates(ClaimFilters(work_types=("a.mine", "b.paused")), 2)
    scans = work_item_scans(plan)
    # One branch ran (a.mine's); the paused type was dropped before its branch.
    assert sum(n["Actual Loops"] for n in scans) == 1, plan
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in scans) == 1, plan
    leases = LeaseManager("w").acquire_leases(4, 60, work_type_filter=("a.mine", "b.paused"))
    assert [lease.work_item_id for lease in leases] == [mine.pk]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_branched_claim_skips_rows_another_claim_holds(threads):
    """Two claims in flight at once each get their own rows, in claim order."""
    enqueue_many([{"task_id": f"i{i}", "work_type": "t.a"} for i in range(6)])
    order = [item.pk for item in sorted(WorkItem.objects.all(), key=_claim_order_key)]
    filters = ClaimFilters(work_types=("t.a", "t.b"))
    assert type_branches(filters)
    cte, params = locked_candidates(storage_for(), filters, 3, by_type=True)
    gate = threading.Barrier(2)

    def claim(i: int) -> list[str]:
        with transaction.atomic(), connection.cursor() as cursor:
            if i == 1:
                gate.wait(timeout=30)  # until the first claim holds its rows
            cursor.execute(f"WITH {cte} SELECT work_item_id FROM candidate", params)
            ids = [row[0] for row in cursor.fetchall()]
            if i == 0:
                gate.wait(timeout=30)
            gate.wait(timeout=30)  # the first keeps its locks until the second has read
            return ids

    first, second = threads(2, claim)
    assert first == order[:3]
    assert second == order[3:]


@pytest.mark.parametrize("types", [None, ("job",)])
def test_a_settled_claim_leaves_fresh_items_and_takes_those_available_long_enough(types):
    # A poll by a worker that does not answer wakes (leasing.worker.dispatcher,
    # POLL_SETTLED_S): the fresh items are the leader's. With types, a small claim
    # reads one branch per type (by_type); the settled rule holds there too.
    from datetime import timedelta

    from django.utils import timezone

    from leasing.services.terms import claim_terms

    fresh = enqueue("fresh", "job").work_item_id
    settled = enqueue("settled", "job").work_item_id
    WorkItem.objects.filter(work_item_id=settled).update(
        run_after=timezone.now() - timedelta(seconds=30)
    )
    manager = LeaseManager("w")
    filters = ClaimFilters(work_types=types, settled_s=10.0)
    assert [lease.work_item_id for lease in manager.claim(5, claim_terms(None), filters)] == [
        settled
    ]
    assert manager.claim(5, claim_terms(None), filters) == []  # the fresh one is left
    plain = ClaimFilters(work_types=types)
    assert [lease.work_item_id for lease in manager.claim(5, claim_terms(None), plain)] == [fresh]
