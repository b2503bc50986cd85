"""Claims filtered to some work types or queues: every item of them, none of the others.

On PostgreSQL the claim also checks the range of its types and queues on the
claim index's entries, so the items of other types or queues that come first
in claim order are skipped without reading their rows.
"""

from __future__ import annotations

import pytest
from django.db import connection

from leasing import LeaseManager, enqueue, enqueue_many
from leasing.sql.dialect import Dialect
from leasing.sql.terms import ClaimFilters
from leasing.sql.work_items import _candidates
from tests.plans import work_item_scans

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
    sql, params = _candidates(Dialect(), ClaimFilters(**{asked: (mine,)}), 1)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE work_items")
        # The claim's own planner settings (Dialect.in_claim_order).
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0][0]["Plan"]
        cursor.execute(sql, params)
        assert cursor.fetchall() == [(item.pk,)]
    scans = work_item_scans(plan)
    assert [n.get("Index Name") for n in scans] == ["work_items_claim_idx"], plan
    # The 2,000 others were passed over on the index: one row read, none filtered out.
    assert column in scans[0]["Index Cond"], plan
    assert scans[0]["Actual Rows"] == 1 and scans[0].get("Rows Removed by Filter", 0) == 0, plan
