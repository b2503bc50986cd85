"""After all of a worker's backends are terminated, a run that starts afterwards runs normally.

A handler that sleeps through the termination holds its executor's (or its
child's) connection, dead now, without using it: the next run on that thread
or child must get a working connection, not be interrupted by the dead one
(in process mode, without the check, every later run of the child was).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from leasing import enqueue, enqueue_many
from leasing.models import Checkpoint
from tests.support.helpers import recorded, row, wait_for
from tests.support.workers import leasing_env, parse_summary

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def terminate_other_backends() -> int:
    """Terminate every other session on the test database: all of the worker's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def completed(item_id: str) -> bool:
    return row(item_id)["status"] == "completed"


@pytest.mark.parametrize("execution", ["thread", "process"])
def test_runs_started_after_the_termination_are_not_interrupted(
    spawn: Any, tmp_path: Path, execution: str
) -> None:
    record = tmp_path / "runs.txt"
    proc = spawn(
        "manage.py",
        "runworker",
        "--concurrency",
        "1",
        "--execution",
        execution,
        env={"LEASING_TEST_RECORD": str(record), **leasing_env(LISTEN=False)},
    )
    # The executor (or its child) opens its connection, then sleeps through the termination.
    warm = enqueue("warm", "test.db_query")
    wait_for(lambda: completed(warm.pk), timeout=60)  # a child sets Django up first
    slow = enqueue("slow", "test.sleep", input_data={"seconds": 0.8})
    wait_for(lambda: recorded(record, "start"))
    assert terminate_other_backends() >= 1
    after = enqueue_many(
        [{"task_id": f"after-{i}", "work_type": "test.db_query"} for i in range(3)]
    )
    for item in [slow, *after]:
        wait_for(lambda pk=item.pk: completed(pk))
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "database unavailable" in err  # the worker's own connections died too
    for item in after:
        found = row(item.pk)
        assert (found["retry_count"], found["lease_token"]) == (0, 1), err
        assert found["output_data"] == {"found": True}
    assert not Checkpoint.objects.filter(snapshot_data__reason="interrupted").exists()
    assert parse_summary(out)["interrupted"] == 0
