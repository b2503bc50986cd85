"""Dependencies under concurrency, with real processes (PostgreSQL).

Enqueuers add dependents of items that worker processes are completing (or
failing) at the same moment. Whatever the interleaving, each dependent's
counter must equal the number of its dependencies not completed, so that no
dependent is released early or left blocked forever.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.db import connection

from leasing import enqueue_many
from leasing.models import WorkItem
from tests.support.helpers import ROOT, wait_for
from tests.support.workers import leasing_env

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def counters_disagree() -> list[tuple]:
    """Items whose dependencies_left is not the number of their unfinished dependencies."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT w.work_item_id, w.dependencies_left, count(d.work_item_id)
            FROM work_items AS w
            LEFT JOIN work_item_dependencies AS e ON e.dependent_id = w.work_item_id
            LEFT JOIN work_items AS d
                   ON d.work_item_id = e.dependency_id AND d.status <> 'completed'
            GROUP BY w.work_item_id, w.dependencies_left
            HAVING w.dependencies_left <> count(d.work_item_id)
            """
        )
        return cursor.fetchall()


def start(spawn, subprocess_env, log, parents_type: str, *, waiting: bool = False) -> list:
    enqueue_many(
        [
            {"task_id": f"parent-{i}", "work_type": parents_type, "input_data": {"seconds": 0.05}}
            for i in range(600)
        ]
    )
    # The enqueuers start once 30 parents have ended; the other 570 take the
    # workers' 8 threads at least 3.5 s more, so dependents land both before
    # and after their dependencies end.
    extra = ["wait"] if waiting else []
    enqueuers = [
        spawn("-m", "tests.procs.enqueue_dependents", f"dep{n}", "400", str(n), "30", *extra)
        for n in range(2)
    ]
    # Output to a file, not a pipe nobody reads while they run (a full pipe blocks).
    workers = [
        subprocess.Popen(
            [sys.executable, "manage.py", "runworker", "--concurrency", "4"],
            cwd=ROOT,
            env={**subprocess_env, "LEASING_LOG_LEVEL": "WARNING", **leasing_env()},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for _ in range(2)
    ]
    for proc in enqueuers:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {"enqueued": 400}
    return workers


def stop(workers: list) -> None:
    for proc in workers:
        proc.terminate()
    for proc in workers:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    assert all(proc.returncode == 0 for proc in workers)


def test_dependents_enqueued_while_their_dependencies_complete_all_run(
    spawn, subprocess_env, tmp_path
):
    with open(tmp_path / "workers.log", "wb") as log:
        workers = start(spawn, subprocess_env, log, "test.sleep")
    try:
        wait_for(
            lambda: not WorkItem.objects.exclude(status="completed").exists(),
            timeout=240,
            interval=0.2,
        )
    finally:
        stop(workers)
    assert WorkItem.objects.count() == 600 + 800
    assert counters_disagree() == []
    with connection.cursor() as cursor:
        # The race happened: dependents were enqueued both before and after
        # one of their dependencies completed.
        cursor.execute(
            """
            SELECT count(*) FILTER (WHERE b.created_at < a.completed_at),
                   count(*) FILTER (WHERE b.created_at > a.completed_at)
            FROM work_item_dependencies AS e
            JOIN work_items AS a ON a.work_item_id = e.dependency_id
            JOIN work_items AS b ON b.work_item_id = e.dependent_id
            WHERE a.task_id LIKE 'parent-%%'
            """
        )
        before, after = cursor.fetchone()
        assert before > 10 and after > 10, (before, after)
    # Each dependent ran after every one of its dependencies had completed: its
    # handler, reading in a transaction of its own, found none unfinished. (The
    # rows' timestamps cannot show it: `started_at` is when the claim's query
    # reached the server, and its snapshot can be taken a moment later, after a
    # dependency whose `completed_at` is later still committed.)
    dependents = WorkItem.objects.exclude(task_id__startswith="parent-")
    outputs = list(dependents.values_list("output_data", flat=True))
    assert len(outputs) == 800
    assert all(output == {"unfinished_dependencies": 0} for output in outputs), [
        output for output in outputs if output != {"unfinished_dependencies": 0}
    ][:5]


def test_dependents_enqueued_while_their_dependencies_fail_fail_or_wait(
    spawn, subprocess_env, tmp_path
):
    with open(tmp_path / "workers.log", "wb") as log:
        workers = start(spawn, subprocess_env, log, "test.permanent", waiting=True)
    try:
        wait_for(
            lambda: (
                not WorkItem.objects.filter(status__in=["in_progress"]).exists()
                and not WorkItem.objects.claimable().exists()
                and WorkItem.objects.filter(task_id__startswith="parent-", status="failed").count()
                == 600
            ),
            timeout=240,
            interval=0.2,
        )
    finally:
        stop(workers)
    assert counters_disagree() == []
    dependents = WorkItem.objects.exclude(task_id__startswith="parent-")
    # Every dependent waits on at least one failed parent: none ran.
    assert not dependents.filter(lease_token__gt=0).exists()
    # `fail` ones failed, naming a failed dependency; `wait` ones are blocked.
    for item in dependents:
        if item.on_dependency_failure == "fail":
            assert item.status == "failed", item
            assert item.error_message.startswith("dependency failed: ")
        else:
            assert (item.status, item.dependencies_left > 0) == ("pending", True), item
