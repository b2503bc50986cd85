"""One idle worker answers each wake (`leasing.worker.leadership`): real `runworker`
processes on PostgreSQL.

The workers poll every 30 s here, so an item that starts within a second was
started by a wake (or by a worker taking over the lead), never by a poll.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from leasing import enqueue, enqueue_many
from leasing.models import Worker, WorkItem
from tests.support.helpers import ROOT, wait_for
from tests.support.queries import listening_sessions as _listening
from tests.support.workers import leasing_env, stop_workers

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# Polls too rare to matter: every claim here follows a NOTIFY.
POLL_S = 30


def start(
    subprocess_env: dict[str, str],
    log: Path,
    record: Path,
    *args: str,
    prefetch: int | None,
    poll_s: float = POLL_S,
):
    env = {
        **subprocess_env,
        "LEASING_LOG_LEVEL": "WARNING",
        "LEASING_TEST_RECORD": str(record),
        **leasing_env(POLL_INTERVAL=poll_s, PREFETCH=prefetch),
    }
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "manage.py", "runworker", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def start_workers(
    subprocess_env,
    tmp_path: Path,
    count: int,
    *args: str,
    prefetch: int | None = None,
    poll_s: float = POLL_S,
):
    record = tmp_path / "ran.txt"
    record.touch()
    log = tmp_path / "workers.log"
    procs = [
        start(subprocess_env, log, record, *args, prefetch=prefetch, poll_s=poll_s)
        for _ in range(count)
    ]
    # Running, and every listener connected (its statements are LISTEN or carry the mark).
    wait_for(lambda: Worker.objects.filter(status="running").count() == count, timeout=60)
    wait_for(lambda: _listening() >= count, timeout=30)
    return procs, record


def runs(record: Path) -> list[tuple[str, str]]:
    """(item id, worker id) of every run, in the order they ran."""
    lines = record.read_text().splitlines()
    return [(parts[0], parts[3]) for parts in (line.split(" ") for line in lines)]


def start_latencies(ids) -> list[float]:
    rows = WorkItem.objects.filter(work_item_id__in=list(ids)).values_list(
        "started_at", "created_at"
    )
    return [(started - created).total_seconds() for started, created in rows]


def test_one_idle_worker_answers_the_wakes_and_each_item_starts_at_once(subprocess_env, tmp_path):
    # Room for every item: a leader whose claim fills steps down (by design), which
    # on a loaded host, its items finishing late, would hand the lead over mid-run.
    procs, record = start_workers(subprocess_env, tmp_path, 4, prefetch=200)
    try:
        ids = []
        for i in range(20):
            ids.append(enqueue(f"wake-{i}", "test.noop").work_item_id)
            time.sleep(0.05)
        wait_for(lambda: len(runs(record)) == 20, timeout=20)
    finally:
        stop_workers(procs)
    assert all(proc.returncode == 0 for proc in procs)
    # Every item started on its wake: nothing waited for a 30 s poll.
    latencies = start_latencies(ids)
    assert len(latencies) == 20 and max(latencies) < 1.0, latencies
    # One worker answered (nearly) every wake; the others claimed nothing for them.
    by_worker = Counter(worker for _, worker in runs(record))
    assert by_worker.most_common(1)[0][1] >= 18, by_worker


def test_a_leader_without_room_hands_off_and_every_idle_worker_starts_one(subprocess_env, tmp_path):
    # One item at a time each and no claiming ahead: the first claim fills the
    # leader, which must step down for the other three to start theirs: each
    # takes the lead in turn (a try every LEAD_RETRY_S), claims and steps down.
    from leasing.worker.leadership import LEAD_RETRY_S

    procs, record = start_workers(subprocess_env, tmp_path, 4, "--concurrency", "1", prefetch=0)
    try:
        items = enqueue_many(
            [
                {"task_id": f"slow-{i}", "work_type": "test.sleep", "input_data": {"seconds": 3}}
                for i in range(4)
            ]
        )
        ids = [item.work_item_id for item in items]
        wait_for(
            lambda: (
                WorkItem.objects.filter(work_item_id__in=ids, started_at__isnull=False).count() == 4
            ),
            timeout=2.5,  # before the first 3 s item ends: four workers, one item each
        )
        latencies = start_latencies(ids)
        holders = set(
            WorkItem.objects.filter(work_item_id__in=ids).values_list("lease_holder", flat=True)
        )
        wait_for(lambda: len(runs(record)) == 4, timeout=20)
    finally:
        stop_workers(procs)
    # Three handoffs, each within a try's interval (with a margin for the claims).
    assert max(latencies) < 3 * LEAD_RETRY_S + 0.5, latencies
    assert len(holders) == 4


def test_when_the_leader_dies_the_next_wake_is_answered_by_another(subprocess_env, tmp_path):
    procs, record = start_workers(subprocess_env, tmp_path, 3)
    try:
        first = enqueue("lead-0", "test.noop").work_item_id
        wait_for(lambda: len(runs(record)) == 1, timeout=10)
        leader = runs(record)[0][1]
        pid = int(leader.split(":")[1])
        victim = next(proc for proc in procs if proc.pid == pid)
        os.kill(pid, signal.SIGKILL)
        victim.wait(timeout=10)
        # Its listener's session ends with it, and the lead with the session.
        wait_for(lambda: _listening() == 2, timeout=10)
        second = enqueue("lead-1", "test.noop").work_item_id
        wait_for(lambda: len(runs(record)) == 2, timeout=10)
    finally:
        stop_workers([proc for proc in procs if proc.poll() is None])
    assert runs(record)[1][0] == second and runs(record)[1][1] != leader
    assert max(start_latencies([first, second])) < 1.0


def test_a_stopping_leader_hands_off(subprocess_env, tmp_path):
    # The leader runs a 3 s item and is asked to stop: it claims nothing more,
    # so the next wake must reach another worker while it finishes.
    procs, record = start_workers(subprocess_env, tmp_path, 2, "--concurrency", "2")
    try:
        slow = enqueue("stop-0", "test.sleep", input_data={"seconds": 3}).work_item_id
        wait_for(
            lambda: WorkItem.objects.filter(work_item_id=slow, status="in_progress").exists(),
            timeout=10,
        )
        holder = WorkItem.objects.get(work_item_id=slow).lease_holder
        leader = next(p for p in procs if p.pid == int(holder.split(":")[1]))
        leader.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        quick = enqueue("stop-1", "test.noop").work_item_id
        wait_for(
            lambda: WorkItem.objects.filter(work_item_id=quick, status="completed").exists(),
            timeout=2.5,  # before the leader's 3 s item ends
        )
        ran_quick = next(worker for item, worker in runs(record) if item == quick)
        leader.wait(timeout=30)  # it finishes its item and exits (a second signal would not)
    finally:
        stop_workers(procs)
    assert ran_quick != holder
    assert start_latencies([quick])[0] < 1.0
    assert leader.returncode == 0
    assert WorkItem.objects.get(work_item_id=slow).status == "completed"


def test_a_trickle_of_enqueues_shares_claims_and_completions(subprocess_env, tmp_path):
    # One item per enqueue, back to back: each sends a NOTIFY. While work is
    # scarce the leader's claims are CLAIM_COOLDOWN_SECONDS apart, and finished
    # items wait for the next claim to be completed in its statement. Items
    # claimed (completed) by one statement share its lease_acquired_at
    # (completed_at): the statement's clock.
    from leasing.worker.dispatcher import CLAIM_COOLDOWN_SECONDS

    procs, record = start_workers(subprocess_env, tmp_path, 2)
    try:
        enqueue("warm-up", "test.noop")  # the first item teaches the worker it is quick
        wait_for(lambda: len(runs(record)) == 1, timeout=10)
        started = time.monotonic()
        ids = trickle(200, threads=4)
        span = time.monotonic() - started
        wait_for(lambda: len(runs(record)) == 201, timeout=30)
    finally:
        stop_workers(procs)
    rows = WorkItem.objects.filter(work_item_id__in=ids)
    claims = len(set(rows.values_list("lease_acquired_at", flat=True)))
    completions = len(set(rows.values_list("completed_at", flat=True)))
    # Claims at least the cooldown apart while the enqueues lasted, and a few
    # more as the trickle ends (each claim before its cooldown was up would
    # add one); one claim an enqueue if every wake had its own round trip.
    most = span / CLAIM_COOLDOWN_SECONDS + 10
    assert most < 0.8 * len(ids), f"enqueues too slow to tell ({span:.2f} s)"
    assert claims <= most, (claims, most)
    # Completions ride along with claims rather than taking a round trip each.
    assert completions <= most + 2, (completions, most)


def test_workers_that_do_not_lead_leave_fresh_items_to_the_leader_at_their_polls(
    subprocess_env, tmp_path
):
    # The others poll every 0.1 s, and enqueues come faster than the leader's
    # claims (it trickles: a claim every 50 ms), so at any time a few items wait
    # for its next claim. A poll that took them would cost two round trips for
    # what that claim carries anyway; polls take only items older than
    # POLL_SETTLED_S, which the leader never lets happen here. Room for every
    # item: a leader whose claim fills steps down (by design: enqueues then
    # outrun it), which on a loaded host would hand the lead over mid-run.
    procs, record = start_workers(subprocess_env, tmp_path, 3, poll_s=0.1, prefetch=200)
    try:
        enqueue("warm-up", "test.noop")  # the first item teaches the worker it is quick
        wait_for(lambda: len(runs(record)) == 1, timeout=10)
        ids = set(trickle(150, threads=2))
        wait_for(lambda: len(runs(record)) == 151, timeout=30)
    finally:
        stop_workers(procs)
    by_worker = Counter(worker for item, worker in runs(record) if item in ids)
    assert by_worker.most_common(1)[0][1] >= 0.9 * len(ids), by_worker


def trickle(count: int, threads: int) -> list[str]:
    """`count` single-item enqueues (a commit and a NOTIFY each) from `threads` threads
    at once, so their commits overlap on a slow disk; the ids."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    def some(start: int) -> list[str]:
        try:
            return [enqueue(f"trickle-{i}", "test.noop").work_item_id
                    for i in range(start, count, threads)]  # fmt: skip
        finally:
            connection.close()  # this thread's own

    with ThreadPoolExecutor(threads) as pool:
        return [item for ids in pool.map(some, range(threads)) for item in ids]
