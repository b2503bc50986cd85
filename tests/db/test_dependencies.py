"""Dependencies between work items (SQLite and PostgreSQL).

An item with `depends_on` is not claimable until every dependency completed;
a dependency that fails for good fails its dependents (`fail`) or leaves them
blocked (`wait`). Every way an item ends carries that to its dependents.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from leasing import LeaseManager, RecoverySweep, apply_action, enqueue, enqueue_many, waiting_on
from leasing.exceptions import InvalidInput, UnknownDependency
from leasing.models import WorkItem, WorkItemDependency
from leasing.services import completion, dependencies
from leasing.services.endings import fail_attempt
from leasing.services.retention import purge_finished_items
from tests.support.helpers import database_now, row
from tests.support.items import claimable_ids, get, run_item
from tests.support.plans import work_item_scans

pytestmark = pytest.mark.django_db


# --- blocking and releasing ----------------------------------------------------------------


def test_a_dependent_is_claimable_only_after_its_dependency_completed():
    parent = enqueue("parent", "w")
    child = enqueue("child", "w", depends_on=[parent.work_item_id], priority=10)
    assert get(child).dependencies_left == 1 and get(child).status == "pending"
    assert get(parent).has_dependents is True
    # The higher-priority child is skipped: the claim takes the parent.
    manager = LeaseManager("w1")
    lease = manager.acquire_lease(60)
    assert lease.work_item_id == parent.work_item_id
    assert manager.acquire_lease(60) is None
    manager.release_lease(lease.work_item_id, success=True)
    assert get(child).dependencies_left == 0
    assert manager.acquire_lease(60).work_item_id == child.work_item_id


def test_fan_out_releases_every_child_at_once():
    parent = enqueue("parent", "w")
    children = enqueue_many(
        [{"task_id": f"c{i}", "work_type": "w", "depends_on": [parent]} for i in range(50)]
    )
    assert claimable_ids() == {parent.pk}
    run_item(parent)
    assert claimable_ids() == {c.pk for c in children}


def test_fan_in_waits_for_all_thousand_dependencies(is_postgres):
    parts = enqueue_many([{"task_id": f"p{i}", "work_type": "w"} for i in range(1000)])
    join = enqueue("join", "w", depends_on=[p.work_item_id for p in parts])
    assert get(join).dependencies_left == 1000
    assert WorkItemDependency.objects.filter(dependent=join.pk).count() == 1000
    manager = LeaseManager("w1")
    leases = []
    while len(leases) < 1000:
        leases += manager.acquire_leases(200, 60)
    # The batch completion a worker does; all but one dependency first.
    done = completion.complete(manager, [(lease, None) for lease in leases[:999]])
    assert len(done.completed) == 999 and not done.lost
    assert get(join).dependencies_left == 1
    assert join.pk not in claimable_ids()
    done = completion.complete(manager, [(leases[999], None)])
    assert len(done.completed) == 1
    assert get(join).dependencies_left == 0
    assert claimable_ids() == {join.pk}


def test_complete_and_claim_releases_dependents_and_claims_in_one_call():
    parent = enqueue("parent", "w")
    child = enqueue("child", "w", depends_on=[parent])
    manager = LeaseManager("w1")
    lease = manager.acquire_lease(60)
    terms = manager_terms()
    done, claimed = completion.complete_and_claim(
        manager, [(lease, '{"ok":true}')], 5, terms, filters()
    )
    assert [lease.work_item_id for lease in done.completed] == [parent.pk]
    assert get(parent).output_data == {"ok": True}
    assert get(child).dependencies_left == 0
    # The child released by the completion comes with the same call's claim.
    assert [lease.work_item_id for lease in claimed] == [child.pk]


def manager_terms():
    from leasing.services.terms import claim_terms

    return claim_terms(60)


def filters():
    from leasing.sql.terms import ClaimFilters

    return ClaimFilters()


def test_a_dependency_already_completed_does_not_block():
    parent = enqueue("parent", "w")
    run_item(parent)
    child = enqueue("child", "w", depends_on=[parent.pk])
    assert get(child).dependencies_left == 0
    assert claimable_ids() == {child.pk}
    # The edge is kept: the item page shows what it waited for.
    assert dependencies.waiting_on(child.pk).total == 1


def test_positions_chain_items_of_one_batch():
    a, b, c = enqueue_many(
        [
            {"task_id": "a", "work_type": "w"},
            {"task_id": "b", "work_type": "w", "depends_on": [0]},
            {"task_id": "c", "work_type": "w", "depends_on": [1, 0]},
        ]
    )
    assert (get(a).dependencies_left, get(b).dependencies_left, get(c).dependencies_left) == (
        0,
        1,
        2,
    )
    assert claimable_ids() == {a.pk}
    run_item(a)
    assert claimable_ids() == {b.pk}
    run_item(b)
    assert claimable_ids() == {c.pk}


def test_a_failed_attempt_that_will_be_retried_does_not_touch_dependents():
    parent = enqueue("parent", "w", max_retries=1)
    child = enqueue("child", "w", depends_on=[parent])
    manager = LeaseManager("w1")
    lease = manager.acquire_lease(60)
    manager.release_lease(lease.work_item_id, success=False, error="flaky", retry=True)
    assert get(parent).status == "pending"
    assert (get(child).status, get(child).dependencies_left) == ("pending", 1)


# --- failure -------------------------------------------------------------------------------


def test_a_failed_dependency_fails_its_dependents_transitively():
    a = enqueue("a", "w")
    b = enqueue("b", "w", depends_on=[a])
    c = enqueue("c", "w", depends_on=[b])
    waiter = enqueue("waiter", "w", depends_on=[a], on_dependency_failure="wait")
    run_item(a, success=False)
    assert (get(b).status, get(b).error_message) == ("failed", f"dependency failed: {a.pk}")
    assert (get(c).status, get(c).error_message) == ("failed", f"dependency failed: {b.pk}")
    assert get(c).completed_at is not None
    assert (get(waiter).status, get(waiter).dependencies_left) == ("pending", 1)
    assert claimable_ids() == set()


def test_a_handler_failure_through_the_endings_fails_dependents():
    parent = enqueue("parent", "w", max_retries=0)
    child = enqueue("child", "w", depends_on=[parent])
    manager = LeaseManager("w1")
    lease = manager.acquire_lease(60)
    outcome = fail_attempt(manager, lease, RuntimeError("handler broke"), retry=True)
    assert outcome.status == "failed"
    assert get(child).status == "failed"


def test_an_item_depending_on_a_failed_item_fails_at_enqueue_or_waits():
    parent = enqueue("parent", "w")
    run_item(parent, success=False)
    failing = enqueue("failing", "w", depends_on=[parent])
    waiting = enqueue("waiting", "w", depends_on=[parent], on_dependency_failure="wait")
    assert (get(failing).status, get(failing).error_message) == (
        "failed",
        f"dependency failed: {parent.pk}",
    )
    assert failing.status == "failed"  # the returned instance says so too
    assert (get(waiting).status, get(waiting).dependencies_left) == ("pending", 1)


def test_failure_inside_one_batch_propagates_through_positions():
    parent = enqueue("parent", "w")
    run_item(parent, success=False)
    x, y, z = enqueue_many(
        [
            {"task_id": "x", "work_type": "w", "depends_on": [parent.pk]},
            {"task_id": "y", "work_type": "w", "depends_on": [0]},
            {"task_id": "z", "work_type": "w", "depends_on": [1], "on_dependency_failure": "wait"},
        ]
    )
    assert get(x).status == "failed" and get(y).status == "failed"
    assert get(y).error_message == f"dependency failed: {x.pk}"
    assert (get(z).status, get(z).dependencies_left) == ("pending", 1)


def test_the_sweep_failing_an_expired_item_fails_its_dependents():
    parent = enqueue("parent", "w", max_retries=0)
    child = enqueue("child", "w", depends_on=[parent])
    LeaseManager("dead-worker").acquire_lease(60)
    WorkItem.objects.filter(pk=parent.pk).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )
    stats = RecoverySweep(scan_interval_seconds=5).scan_and_recover()
    assert stats.failed == 1
    assert get(parent).status == "failed"
    assert (get(child).status, get(child).error_message) == (
        "failed",
        f"dependency failed: {parent.pk}",
    )


def test_the_sweep_requeueing_an_item_leaves_dependents_blocked():
    parent = enqueue("parent", "w", max_retries=2)
    child = enqueue("child", "w", depends_on=[parent])
    LeaseManager("dead-worker").acquire_lease(60)
    WorkItem.objects.filter(pk=parent.pk).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )
    assert RecoverySweep(scan_interval_seconds=5).scan_and_recover().recovered == 1
    assert (get(child).status, get(child).dependencies_left) == ("pending", 1)


# --- operators -------------------------------------------------------------------------------


def act(action: str, item: Any) -> Any:
    return apply_action(action, get(item).pk, expected_token=None, actor="ops", reason="test")


def test_force_failing_a_blocked_or_pending_item_fails_its_dependents():
    a = enqueue("a", "w")
    b = enqueue("b", "w", depends_on=[a])
    c = enqueue("c", "w", depends_on=[b])
    result = act("force_fail", b)
    assert result.applied and "1 dependent item(s) failed with it" in result.detail
    assert get(c).status == "failed" and get(c).error_message == f"dependency failed: {b.pk}"
    assert get(a).status == "pending"


def test_retrying_a_dependent_waits_for_its_dependency_to_be_retried_first():
    a = enqueue("a", "w")
    b = enqueue("b", "w", depends_on=[a])
    run_item(a, success=False)
    assert get(b).status == "failed"
    refused = act("retry", b)
    assert not refused.applied
    assert refused.detail == (
        f"skipped: its dependency {a.pk} failed and it fails with its dependencies: "
        "retry that one first"
    )
    assert get(b).status == "failed"
    assert act("retry", a).applied
    assert act("retry", b).applied
    # b is pending again and still counts a as unfinished: it waits for it.
    assert (get(b).status, get(b).dependencies_left) == ("pending", 1)
    assert claimable_ids() == {a.pk}
    run_item(a)
    assert claimable_ids() == {b.pk}


def test_a_waiting_dependent_runs_once_its_failed_dependency_is_retried_and_completes():
    a = enqueue("a", "w")
    b = enqueue("b", "w", depends_on=[a], on_dependency_failure="wait")
    run_item(a, success=False)
    assert act("retry", a).applied
    run_item(a)
    assert claimable_ids() == {b.pk}


# --- refused input -----------------------------------------------------------------------------


def test_an_unknown_dependency_is_refused_and_nothing_is_written():
    known = enqueue("known", "w")
    with pytest.raises(UnknownDependency, match="no work item with id 'NOPE'"):
        enqueue_many(
            [
                {"task_id": "x", "work_type": "w", "depends_on": [known.pk]},
                {"task_id": "y", "work_type": "w", "depends_on": ["NOPE", known.pk]},
            ]
        )
    assert WorkItem.objects.count() == 1
    assert get(known).has_dependents is False
    assert WorkItemDependency.objects.count() == 0


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ([{"depends_on": [0]}], "item 0 depends on itself"),
        ([{}, {"depends_on": [2]}], "position 2 is not in the batch of 2 items"),
        ([{"depends_on": [1]}, {"depends_on": [0]}], r"dependency cycle: items 0 -> 1 -> 0"),
        (
            [{"depends_on": [2]}, {"depends_on": [0]}, {"depends_on": [1]}],
            r"dependency cycle: items 0 -> 2 -> 1 -> 0",
        ),
        ([{"depends_on": [-1]}], "a batch position must be >= 0"),
        ([{"depends_on": "ABC"}], "depends_on must be a list"),
        ([{"depends_on": [3.5]}], "expected a work item id"),
        ([{"depends_on": [""]}], "depends_on must be a non-empty string"),
        ([{"depends_on": ["x" * 256]}], "depends_on must be at most 255"),
        ([{"on_dependency_failure": "fail"}], "on_dependency_failure needs depends_on"),
        ([{"depends_on": [], "on_dependency_failure": "wait"}], "needs depends_on"),
    ],
)
def test_bad_dependencies_are_refused_and_nothing_is_written(specs, message):
    with pytest.raises(InvalidInput, match=message):
        enqueue_many([{"task_id": f"t{i}", "work_type": "w", **s} for i, s in enumerate(specs)])
    assert WorkItem.objects.count() == 0


def test_a_bad_failure_policy_is_refused():
    parent = enqueue("parent", "w")
    with pytest.raises(InvalidInput, match="must be 'fail' or 'wait'"):
        enqueue("t", "w", depends_on=[parent], on_dependency_failure="ignore")
    with pytest.raises(InvalidInput, match="positions in the batch are for enqueue_many"):
        enqueue("t", "w", depends_on=[0])
    assert WorkItem.objects.count() == 1


def test_a_cycle_through_a_unique_duplicate_is_refused_and_nothing_is_written():
    # Item 1 has item 0's key, so it is item 0: "0 depends on 2, 2 on 1" is a cycle.
    with pytest.raises(InvalidInput, match="dependency cycle"):
        enqueue_many(
            [
                {"task_id": "a", "work_type": "w", "unique_key": "k", "depends_on": [2]},
                {"task_id": "b", "work_type": "w", "unique_key": "k"},
                {"task_id": "c", "work_type": "w", "depends_on": [1]},
            ]
        )
    assert WorkItem.objects.count() == 0


def test_a_position_naming_a_duplicate_depends_on_the_holder():
    holder = enqueue("holder", "w", unique_key="build")
    dup, after = enqueue_many(
        [
            {"task_id": "b2", "work_type": "w", "unique_key": "build"},
            {"task_id": "after", "work_type": "w", "depends_on": [0]},
        ]
    )
    assert dup.duplicate and dup.pk == holder.pk
    assert dependencies.waiting_on(after.pk).items[0].work_item_id == holder.pk
    assert get(holder).has_dependents is True
    run_item(holder)
    assert claimable_ids() == {after.pk}


def test_a_duplicate_keeps_the_holders_dependencies():
    a = enqueue("a", "w")
    first = enqueue("t", "w", unique_key="k")
    again = enqueue("t", "w", unique_key="k", depends_on=[a])
    assert again.duplicate and again.pk == first.pk
    assert get(first).dependencies_left == 0
    assert WorkItemDependency.objects.count() == 0


# --- reads for the console ------------------------------------------------------------------


def test_waiting_on_and_dependents_of():
    a, b = enqueue("a", "w"), enqueue("b", "w")
    c = enqueue("c", "w", depends_on=[a, b], on_dependency_failure="wait")
    run_item(a)
    waiting = dependencies.waiting_on(c.pk)
    assert (waiting.work_item_id, waiting.left, waiting.total) == (c.pk, 1, 2)
    assert waiting.blocked is True and waiting.on_failure == "wait"
    # Unfinished first, then completed.
    assert [(d.work_item_id, d.status) for d in waiting.items] == [
        (b.pk, "pending"),
        (a.pk, "completed"),
    ]
    assert waiting.items[0].task_id == "b"
    deps_of_a = dependencies.dependents_of(a.pk)
    assert deps_of_a.total == 1 and [d.work_item_id for d in deps_of_a.items] == [c.pk]
    free = dependencies.waiting_on(a.pk)
    assert (free.total, free.left, free.blocked, free.items) == (0, 0, False, ())


def test_waiting_on_an_unknown_item_raises():
    from leasing.exceptions import WorkItemNotFound

    with pytest.raises(WorkItemNotFound):
        dependencies.waiting_on("NOPE")
    with pytest.raises(InvalidInput):
        dependencies.dependents_of("")


def test_reads_are_bounded_by_limit():
    parts = enqueue_many([{"task_id": f"p{i}", "work_type": "w"} for i in range(30)])
    join = enqueue("join", "w", depends_on=parts)
    waiting = dependencies.waiting_on(join.pk, limit=10)
    assert waiting.total == 30 and len(waiting.items) == 10
    assert dependencies.dependents_of(parts[0].pk, limit=1).total == 1


# --- purging and plain paths ---------------------------------------------------------------


def test_purging_finished_items_removes_their_edges(is_postgres):
    parent = enqueue("parent", "w")
    child = enqueue("child", "w", depends_on=[parent])
    run_item(parent)
    run_item(child)
    WorkItem.objects.update(completed_at=database_now() - timedelta(days=2))
    assert purge_finished_items(timedelta(days=1)).items_deleted == 2
    assert WorkItemDependency.objects.count() == 0


def test_a_retried_item_no_longer_waits_for_a_dependency_purged_since_it_failed():
    """Found by the model test: the retry counted the purged dependency, so the item
    waited forever for an item that no longer exists."""
    first = enqueue("first", "w")
    doomed = enqueue("doomed", "w")
    apply_action("force_fail", doomed.pk, expected_token=0, actor="ops", reason="bad input")
    both = enqueue("both", "w", depends_on=[first, doomed], on_dependency_failure="fail")
    assert row(both.pk)["status"] == "failed"  # its dependency had failed already
    WorkItem.objects.filter(pk=doomed.pk).update(completed_at=database_now() - timedelta(days=2))
    assert purge_finished_items(timedelta(days=1), statuses=("failed",)).items_deleted == 1
    assert apply_action("retry", both.pk, expected_token=0, actor="ops", reason="again").applied
    assert waiting_on(both.pk).left == 1  # `first` only
    run_item(first)
    assert LeaseManager("w2").acquire_lease(60).work_item_id == both.pk


def test_completing_an_item_nobody_depends_on_is_one_statement():
    enqueue("t", "w")
    manager = LeaseManager("w1")
    lease = manager.acquire_lease(60)
    with CaptureQueriesContext(connection) as queries:
        manager.release_lease(lease.work_item_id, success=True)
    assert len(queries.captured_queries) == 1
    assert "NOT has_dependents" in queries.captured_queries[0]["sql"]


# --- the claim never walks past blocked items ---------------------------------------------


@pytest.mark.postgres
def test_the_claim_reads_no_blocked_item_however_many_there_are():
    from leasing.sql.candidates import plain_candidates
    from leasing.sql.terms import ClaimFilters
    from leasing.storage import storage_for

    parent = enqueue("parent", "w", priority=-1)
    # Ahead of the parent in claim order, were they in the claim index.
    enqueue_many(
        [
            {"task_id": f"b{i}", "work_type": "w", "priority": 5, "depends_on": [parent]}
            for i in range(3000)
        ]
    )
    sql, params = plain_candidates(storage_for(), ClaimFilters(), 1)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE work_items")
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0][0]["Plan"]
        cursor.execute(sql, params)
        assert cursor.fetchall() == [(parent.pk,)]
    # Of work_items, the claim reads one row of its index (the pause probes
    # read the small pauses table, not work items).
    scans = work_item_scans(plan)
    assert [n.get("Index Name") for n in scans] == ["work_items_claim_idx"], plan
    assert scans[0]["Actual Rows"] == 1
    assert scans[0].get("Rows Removed by Filter", 0) == 0


def test_the_claim_statement_uses_the_claim_index(is_postgres):
    from leasing.sql.candidates import plain_candidates
    from leasing.sql.terms import ClaimFilters
    from leasing.storage import storage_for

    parent = enqueue("parent", "w")
    enqueue_many(
        [{"task_id": f"b{i}", "work_type": "w", "depends_on": [parent]} for i in range(50)]
    )
    sql, params = plain_candidates(storage_for(), ClaimFilters(), 1)
    with connection.cursor() as cursor:
        cursor.execute(("EXPLAIN " if is_postgres else "EXPLAIN QUERY PLAN ") + sql, params)
        plan = " ".join(str(row) for row in cursor.fetchall())
    assert "work_items_claim_idx" in plan
