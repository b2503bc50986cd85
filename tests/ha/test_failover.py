"""Failover: the primary dies mid-run, the synchronous standby is promoted, nothing is lost.

Workers and the sweep connect with one multi-host connection
(`host=a,b port=pa,pb target_session_attrs=read-write`), so after the
promotion they find the new primary by themselves.
"""

from __future__ import annotations

import json
import time

import pytest

from .clusters import Cluster
from .helpers import (
    FAST_LEASING,
    audit,
    db_env,
    describe_duplicates,
    overdue_leases,
    query,
    record_result,
    registered_workers,
    scalar,
    wait_until,
)
from .processes import Fleet

ITEMS = 2000
KILL_AFTER_EFFECTS = 500
WORKERS = 4
# How long the "operator" (or a failover manager) takes to notice and promote.
DETECTION_SECONDS = 1.0


@pytest.fixture
def replicated_pair(fleet: Fleet):
    primary = Cluster.create_primary("fo_p")
    standby = None
    try:
        standby = Cluster.create_standby(primary, "fo_s", synchronous=True)
        yield primary, standby
    finally:
        fleet.kill_all()  # no process may outlive the clusters it talks to
        if standby is not None:
            standby.drop()
        primary.drop()


def test_sigkill_primary_promote_standby_every_item_once(
    fleet: Fleet, replicated_pair: tuple[Cluster, Cluster]
) -> None:
    primary, standby = replicated_pair
    fleet.env.update(db_env(["127.0.0.1", "127.0.0.1"], [primary.port, standby.port]))
    both = (
        f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres "
        f"dbname={primary.dbname} target_session_attrs=read-write"
    )
    fleet.manage("migrate", "-v", "0")
    fleet.manage("ha_enqueue", "--count", str(ITEMS), "--input", json.dumps({"sleep": 0.01}))
    assert scalar(standby.dsn(), "SELECT count(*) FROM work_items") == ITEMS  # replicated

    workers = [
        fleet.start(f"worker-{i}", "runworker", "--concurrency", "2") for i in range(WORKERS)
    ]
    sweep = fleet.start("sweep", "recoverysweep")
    wait_until(lambda: registered_workers(both) == WORKERS, timeout=60, message=fleet.tails)
    wait_until(
        lambda: scalar(both, "SELECT count(*) FROM ha_ledger") >= KILL_AFTER_EFFECTS,
        timeout=120,
        message=fleet.tails,
    )

    killed_at = primary.kill()
    done_at_kill = scalar(
        standby.dsn(), "SELECT count(*) FROM work_items WHERE status = 'completed'"
    )
    time.sleep(DETECTION_SECONDS)
    standby.promote()
    promoted_at = time.time()
    assert scalar(standby.dsn(), "SELECT pg_is_in_recovery()") is False

    # Until every item is done, watch for a lease left past its expiry.
    worst_overdue = 0.0
    deadline = time.monotonic() + 240
    while True:
        completed = scalar(both, "SELECT count(*) FROM work_items WHERE status = 'completed'")
        worst_overdue = max(worst_overdue, overdue_leases(both))
        if completed == ITEMS:
            break
        assert time.monotonic() < deadline, (
            f"only {completed}/{ITEMS} completed 240 s after the failover\n{fleet.tails()}"
        )
        time.sleep(0.5)

    first_after, last = query(
        both,
        "SELECT min(completed_at), max(completed_at) FROM work_items "
        "WHERE completed_at >= to_timestamp(%s)",
        (killed_at,),
    )[0]
    result = audit(both)
    record_result(
        "failover",
        items=ITEMS,
        completed_before_kill=done_at_kill,
        promote_after_s=round(promoted_at - killed_at, 2),
        kill_to_first_completion_s=round(first_after.timestamp() - killed_at, 2),
        kill_to_last_item_s=round(last.timestamp() - killed_at, 2),
        worst_overdue_lease_s=round(worst_overdue, 2),
        retried_items=scalar(both, "SELECT count(*) FROM work_items WHERE retry_count > 0"),
    )

    assert result.statuses == {"completed": ITEMS}, result
    # Each run_once effect exactly once. A run killed between its effect and
    # the storing of its response leaves the key `pending`; the engine must not
    # take that for "never happened" and run the effect again.
    assert result.effects == ITEMS and result.ledger_rows == ITEMS, (
        f"side effects not exactly once: {result.ledger_rows} rows for {result.effects} keys; "
        "duplicated (times from the kill):\n"
        + describe_duplicates(both, [k for k, _ in result.duplicated_keys], killed_at)
    )
    assert result.keys_not_completed == 0, result
    # The sweep runs every SWEEP_INTERVAL; a lease expired longer than that
    # (plus one pass and this loop's sampling) was left behind.
    assert worst_overdue <= FAST_LEASING["SWEEP_INTERVAL"] + 3, worst_overdue
    # The processes rode out the failover: none exited, all found the new primary.
    exited = [p.name for p in [*workers, sweep] if not p.alive()]
    assert not exited, f"exited during the failover: {exited}\n{fleet.tails()}"
