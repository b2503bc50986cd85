"""A claim stays a primary-key lookup whatever the statistics say (PostgreSQL).

With autovacuum on, an ANALYZE can run while a burst is still being enqueued:
it counts none of the uncommitted rows, and until the next one the planner
takes `work_items` for an empty table. Joined to its candidates, the claim's
UPDATE was then planned as a nested loop over the whole table for each batch
(a full scan of the primary key with a join filter: 4.7 s a claim of 1,000 in
`make bench` against a cluster with autovacuum on); with the ids as an array it
walked another index that holds them. The UPDATE now finds the rows the
statement locked by their address (a TID scan).
"""

from __future__ import annotations

import json

import psycopg
import pytest
from django.db import connection, transaction

from leasing import LeaseManager, enqueue_many
from leasing.sql.limits import Limits
from leasing.sql.terms import ClaimFilters, LeaseTerms
from leasing.storage import storage_for
from leasing.storage.postgres import CLAIM_PLANNER_OFF
from tests.support.plans import plan_nodes

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TERMS = LeaseTerms(duration=60.0, cap=3600.0)


def enqueue_while_analyzed(count: int) -> None:
    """Enqueue `count` items in one transaction that another session ANALYZEs before it commits."""
    with transaction.atomic():
        enqueue_many([{"task_id": f"t{i}", "work_type": "job"} for i in range(count)])
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**params, autocommit=True) as other:
            other.execute("ANALYZE work_items")
            counted = other.execute(
                "SELECT reltuples FROM pg_class WHERE relname = 'work_items'"
            ).fetchone()[0]
    assert counted == 0  # the statistics now say the table is empty


def explain(statement: tuple[str, list]) -> dict:
    text, params = statement
    with transaction.atomic(), connection.cursor() as cursor:
        for name in CLAIM_PLANNER_OFF:  # the claim's own settings (PostgresStorage.in_claim_order)
            cursor.execute(f"SET LOCAL {name} = off")
        body = text.rpartition("jit = off;")[2]  # after in_claim_order's SET LOCALs, if any
        cursor.execute(f"EXPLAIN (FORMAT JSON) {body}", params)
        return cursor.fetchone()[0][0]["Plan"]


def assert_claimed_by_address(plan: dict) -> None:
    """The claim's UPDATE reads the rows it claims by their ctid (a TID scan)."""
    text = json.dumps(plan)
    claimed = [n for n in plan_nodes(plan) if n.get("Subplan Name") == "CTE claimed"]
    assert len(claimed) == 1, text
    # What feeds the UPDATE (its candidates' subplans aside).
    feed = [n for n in claimed[0]["Plans"] if n["Parent Relationship"] == "Outer"]
    assert [n["Node Type"] for n in feed] == ["Tid Scan"], text
    assert feed[0]["Relation Name"] == "work_items", text
    assert "ctid = ANY" in feed[0]["TID Cond"], text


def test_the_worker_statement_updates_its_rows_by_address_on_statistics_that_count_no_rows():
    enqueue_while_analyzed(3000)
    manager = LeaseManager("w1")
    held = manager.acquire_leases(1000, 60)
    assert len(held) == 1000
    done = [(lease.work_item_id, lease.token, None) for lease in held]
    plan = explain(
        storage_for().complete_and_claim("w1", done, 1000, TERMS, ClaimFilters(), Limits())
    )
    assert_claimed_by_address(plan)


@pytest.mark.parametrize(
    "shape",
    [
        {},
        {"filters": ClaimFilters(work_types=("job", "other")), "by_type": True},
        {"limits": Limits(work_types=(("job", 500),))},
    ],
    ids=["walk", "one branch per type", "with a concurrency limit"],
)
def test_every_claim_shape_updates_its_rows_by_address_on_statistics_that_count_no_rows(shape):
    enqueue_while_analyzed(3000)
    filters = shape.get("filters", ClaimFilters())
    statement = storage_for().claim(
        "w1",
        1000,
        TERMS,
        filters,
        shape.get("limits", Limits()),
        by_type=shape.get("by_type", False),
    )
    assert_claimed_by_address(explain(statement))
    # And the statement claims what it should, in claim order.
    text, params = statement
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(text, params)
        while cursor.description is None and cursor.nextset():
            pass
        rows = cursor.fetchall()
    expected = 500 if "limits" in shape else 1000
    assert len(rows) == expected
    assert len({row[0] for row in rows}) == expected
