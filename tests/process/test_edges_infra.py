"""The database's trouble never costs an item an attempt, and the smaller defects users hit.

* a connection the server dropped while idle is replaced before a handler gets it;
* a handler cut short by a lost connection or a lock timeout is handed back
  without counting a retry (after 5 in a row it counts, so it cannot loop);
* a worker id of a stopped process can be reused, a live one cannot;
* a freed slot wakes the dispatcher whatever the outcome;
* a process is lost after 3 of its own heartbeat intervals, whatever the sweep's.
"""

from __future__ import annotations

import signal
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from leasing import enqueue
from leasing.models import WorkItem
from tests.support.helpers import wait_for
from tests.support.workers import FAST_POLL, leasing_env, parse_summary

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fast_poll(leasing_settings):
    leasing_settings(**FAST_POLL)


def runworker(*args: str) -> dict:
    out = StringIO()
    call_command("runworker", *args, stdout=out)
    return parse_summary(out.getvalue())


def kill_other_backends() -> int:
    """Terminate every other session on the test database (what a failover or a
    restart does to idle pooled connections)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


@pytest.mark.postgres
def test_a_connection_killed_while_idle_costs_the_next_handler_nothing(spawn, tmp_path):
    record = tmp_path / "runs.txt"
    proc = spawn(
        "manage.py",
        "runworker",
        "--concurrency",
        "1",
        env={"LEASING_TEST_RECORD": str(record), **leasing_env(LISTEN=False)},
    )
    first = enqueue("first", "test.db_query", max_retries=3)
    wait_for(lambda: WorkItem.objects.get(pk=first.pk).status == "completed")
    time.sleep(1.5)  # the executor's connection is idle now
    assert kill_other_backends() >= 1
    second = enqueue("second", "test.db_query", max_retries=3)
    wait_for(lambda: WorkItem.objects.get(pk=second.pk).status == "completed")
    row = WorkItem.objects.get(pk=second.pk)
    assert (row.retry_count, row.interruptions, row.lease_token) == (0, 0, 1)
    assert row.output_data == {"found": True}
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
