"""`runworker` runs a graph of dependent items in order (SQLite and PostgreSQL)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from leasing import enqueue_many
from leasing.models import WorkItem
from tests.support.workers import FAST_POLL, parse_summary

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_burst_worker_runs_fan_out_then_fan_in_in_order(leasing_settings):
    leasing_settings(**FAST_POLL)
    # 0 -> (1..20) -> 21, and 22 fails for good, so 23 fails with it while 24 waits.
    specs = [{"task_id": "root", "work_type": "test.echo"}]
    specs += [
        {"task_id": f"leaf{i}", "work_type": "test.echo", "depends_on": [0]} for i in range(20)
    ]
    specs.append({"task_id": "join", "work_type": "test.echo", "depends_on": list(range(1, 21))})
    specs.append({"task_id": "bad", "work_type": "test.permanent"})
    specs.append({"task_id": "after-bad", "work_type": "test.echo", "depends_on": [22]})
    specs.append(
        {
            "task_id": "waits",
            "work_type": "test.echo",
            "depends_on": [22],
            "on_dependency_failure": "wait",
        }
    )
    items = enqueue_many(specs)
    out = StringIO()
    call_command("runworker", "--burst", "--concurrency", "4", stdout=out)
    summary = parse_summary(out.getvalue())
    by_task = {i.task_id: i for i in WorkItem.objects.all()}
    assert summary["completed"] == 22 and summary["failed"] == 1
    root, join = by_task["root"], by_task["join"]
    leaves = [by_task[f"leaf{i}"] for i in range(20)]
    assert all(i.status == "completed" for i in [root, join, *leaves])
    assert all(leaf.started_at >= root.completed_at for leaf in leaves)
    assert join.started_at >= max(leaf.completed_at for leaf in leaves)
    assert by_task["after-bad"].status == "failed"
    assert by_task["after-bad"].error_message == f"dependency failed: {items[22].pk}"
    assert (by_task["waits"].status, by_task["waits"].dependencies_left) == ("pending", 1)
    assert by_task["waits"].lease_token == 0
