"""The documented monitoring SQL (docs/reference/monitoring-sql.md) runs unchanged on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest

from leasing import LeaseManager, create_checkpoint, enqueue, enqueue_many
from leasing.models import WorkItem
from tests.support.helpers import database_now
from tests.support.spec_sql import ACTIVE_AND_STALE, RETRY_DISTRIBUTION, TIMELINE, run

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def test_spec_queries_run_unchanged_and_agree_with_the_tables():
    enqueue_many([{"task_id": f"t{i}", "work_type": "w", "max_retries": 5} for i in range(6)])
    manager = LeaseManager("w1")
    leases = manager.acquire_leases(6, lease_duration_seconds=600)
    WorkItem.objects.filter(pk=leases[0].id).update(
        heartbeat_at=database_now() - timedelta(minutes=5)
    )
    manager.release_lease(leases[1].id, success=True)
    manager.release_lease(leases[2].id, success=False, error="x")
    manager.release_lease(leases[3].id, success=False, error="x", retry=True)
    assert manager.acquire_lease() is None  # leases[3] waits for its backoff
    WorkItem.objects.filter(pk=leases[3].id).update(run_after=None)
    again = manager.acquire_lease()
    assert again.id == leases[3].id
    manager.release_lease(again.id, success=True)

    assert run(ACTIVE_AND_STALE) == [(3, 1)]  # leases 0, 4, 5; lease 0 stale
    assert sorted(run(RETRY_DISTRIBUTION)) == [(0, 2), (1, 1)]

    enqueue("task-001", "w")
    create_checkpoint("task-001", "iteration_start", {"i": 0})
    create_checkpoint("task-001", "iteration_end", {"i": 0, "done": True})
    rows = run(TIMELINE)
    assert [(r[0], r[1]) for r in rows] == [("iteration_start", 1), ("iteration_end", 2)]
    assert rows[1][2] in ({"i": 0, "done": True}, '{"i": 0, "done": true}')
