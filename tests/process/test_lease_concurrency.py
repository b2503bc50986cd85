"""Claims under real concurrency: processes and threads with their own connections."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable

import pytest

from leasing.models import Worker, WorkItem
from tests.support.helpers import wait_for
from tests.support.workers import leasing_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_eight_processes_complete_2000_items_exactly_once(make_items, spawn):
    make_items(2000)
    procs = [spawn("-m", "tests.procs.claim_loop", f"proc-{i}", "4") for i in range(8)]
    claims: Counter[str] = Counter()
    per_process = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        ids = [line.split()[0] for line in out.splitlines() if line.strip()]
        per_process.append(len(ids))
        claims.update(ids)

    assert sum(claims.values()) == 2000
    assert len(claims) == 2000
    assert max(claims.values()) == 1, "an item was claimed twice"
    assert WorkItem.objects.completed().count() == 2000
    assert not WorkItem.objects.exclude(status="completed").exists()
    # Every row was claimed once (token 1) by the process that completed it.
    assert set(WorkItem.objects.values_list("lease_token", flat=True)) == {1}
    holders = Counter(WorkItem.objects.values_list("output_data__by", flat=True))
    assert sum(holders.values()) == 2000
    assert sum(1 for n in per_process if n > 0) >= 2, per_process


def test_eight_processes_claiming_by_work_type_complete_each_item_once(make_items, spawn):
    """Claims filtered to three types, each read one branch per type (`sql.candidates`)."""
    make_items(300, task_id="ahead", work_type="other", priority=5)  # never asked for
    for work_type in ("t.a", "t.b", "t.c"):
        make_items(500, work_type=work_type)
    procs = [spawn("-m", "tests.procs.claim_loop", f"p-{i}", "4", "t.a,t.b,t.c") for i in range(8)]
    claims: Counter[str] = Counter()
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        claims.update(line.split()[0] for line in out.splitlines() if line.strip())

    assert len(claims) == 1500 and max(claims.values()) == 1, "an item was claimed twice"
    assert WorkItem.objects.completed().count() == 1500
    assert set(WorkItem.objects.filter(work_type="other").values_list("status", flat=True)) == {
        "pending"
    }
    assert set(WorkItem.objects.completed().values_list("lease_token", flat=True)) == {1}


def test_eight_runworker_processes_run_every_item_exactly_once(make_items, spawn, tmp_path):
    # The real worker: batched claims with prefetch, batched fenced completions.
    from django.db import connection

    from leasing import enqueue_many

    record = tmp_path / "runs.txt"
    specs = [{"task_id": f"t{i}", "work_type": "test.noop"} for i in range(2000)]

    def start(*burst: str) -> list[subprocess.Popen[str]]:
        return [
            spawn(
                "manage.py",
                "runworker",
                *burst,
                "--work-type",
                "test.noop",
                env={
                    "LEASING_TEST_RECORD": str(record),
                    "LEASING_LOG_LEVEL": "WARNING",
                    **leasing_env(),
                },
            )
            for _ in range(8)
        ]

    # One process must not drain the table while the others are still starting
    # up (it did, on a slow host). PostgreSQL: behind a gate, the table refuses
    # writes until all eight wait on their first claim. SQLite has no such gate:
    # the eight start idle, and the items arrive once all of them are polling.
    if connection.vendor == "postgresql":
        items = enqueue_many(specs)
        procs = _behind_a_gate(lambda: start("--burst"))
    else:
        procs = start()
        wait_for(lambda: Worker.objects.filter(status="running").count() == 8, timeout=120)
        items = enqueue_many(specs)
        wait_for(lambda: WorkItem.objects.completed().count() == 2000, timeout=120)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        _out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    runs = Counter(line.split()[0] for line in record.read_text().splitlines())
    assert set(runs) == {item.pk for item in items}
    assert max(runs.values()) == 1, "an item's handler ran twice"
    assert WorkItem.objects.completed().count() == 2000
    assert set(WorkItem.objects.values_list("lease_token", flat=True)) == {1}
    workers = {line.split()[3] for line in record.read_text().splitlines()}
    assert len(workers) >= 2


def _behind_a_gate(start: Callable[[], list[subprocess.Popen[str]]]) -> list[subprocess.Popen[str]]:
    """PostgreSQL: start processes while `work_items` refuses writes; open it once all wait."""
    import psycopg

    from tests.support.helpers import database_url

    gate = psycopg.connect(database_url())
    try:
        gate.execute("LOCK TABLE work_items IN EXCLUSIVE MODE")
        procs = start()
        deadline = time.monotonic() + 120
        while True:
            # Activity is read once per transaction unless the snapshot is cleared.
            gate.execute("SELECT pg_stat_clear_snapshot()")
            row = gate.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            ).fetchone()
            if row is not None and row[0] >= len(procs):
                return procs
            assert time.monotonic() < deadline, "the processes never reached their first claim"
            assert all(proc.poll() is None for proc in procs), "a process exited before its claim"
            time.sleep(0.05)
    finally:
        gate.commit()
        gate.close()
