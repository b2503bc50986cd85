"""A read replica for the console: pages read from a streaming replica, leases stay on the primary.

`LEASING["READ_DATABASE"] = "replica"` points the console (dashboard, lists,
item and timeline pages, history, `/metrics`) at a real streaming replica.
With the replica's replay paused, the pages show the replica's (older) data
and its lag, while an operator's force-release, of an item the replica has
not even seen yet, is read and applied on the primary.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import pytest

from .clusters import Cluster
from .helpers import db_env, query, record_result, scalar, wait_until
from .processes import Fleet, Proc

# Tables whose reads decide a write: they must never be read from the replica
# on a path that then writes (claims, renewals, releases, operator actions).
LEASE_TABLES = {"work_items", "checkpoints", "idempotency_keys", "workers"}


@pytest.fixture
def primary_and_replica(fleet: Fleet) -> Iterator[tuple[Cluster, Cluster]]:
    primary = Cluster.create_primary("rr_p")
    replica = None
    try:
        replica = Cluster.create_standby(primary, "rr_r", synchronous=False)
        yield primary, replica
    finally:
        fleet.kill_all()
        if replica is not None:
            replica.drop()
        primary.drop()


def replica_lag_seconds(primary: Cluster, replica: Cluster) -> float:
    """How far the replica's replay is behind the primary's last write (seconds)."""
    lag = scalar(
        primary.dsn(),
        "SELECT coalesce(extract(epoch FROM replay_lag), 0) FROM pg_stat_replication "
        "WHERE application_name = %s",
        (replica.name,),
    )
    return float(lag)


def test_replica_streams_the_primary_writes(
    fleet: Fleet, primary_and_replica: tuple[Cluster, Cluster]
) -> None:
    primary, replica = primary_and_replica
    fleet.env.update(db_env(["127.0.0.1"], [primary.port]))
    fleet.manage("migrate", "-v", "0")
    fleet.manage("ha_enqueue", "--count", "100")
    started = time.monotonic()
    wait_until(lambda: scalar(replica.dsn(), "SELECT count(*) FROM work_items") == 100, timeout=30)
    record_result(
        "replica",
        visible_on_replica_after_s=round(time.monotonic() - started, 3),
        replay_lag_s=replica_lag_seconds(primary, replica),
    )
    assert scalar(replica.dsn(), "SELECT pg_is_in_recovery()") is True
    with pytest.raises(Exception, match="read-only"):
        replica.execute("DELETE FROM work_items")


def wedge(proc: Proc, cluster: Cluster) -> None:
    """Stop `proc` between transactions: stopped inside one, it would hold its row locks."""
    open_transactions = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE state IN ('idle in transaction', 'idle in transaction (aborted)')"
    )
    for _ in range(50):
        proc.signal(signal.SIGSTOP)
        if scalar(cluster.dsn(), open_transactions) == 0:
            return
        proc.signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("the holder never stopped between transactions")


def probe(fleet: Fleet, *args: str) -> dict:
    return json.loads(fleet.manage("ha_console_probe", *args))


def assert_served_by_replica(report: dict) -> None:
    for page, seen in report.items():
        if page == "force_release":
            continue
        assert seen["status"] == 200, (page, seen)
        # Every leasing table the page read came from the replica.
        assert not LEASE_TABLES & set(seen["queries"].get("default", [])), (page, seen)
        assert LEASE_TABLES & set(seen["queries"].get("replica", [])), (page, seen)


def test_console_reads_from_replica_and_leases_stay_on_primary(
    fleet: Fleet, primary_and_replica: tuple[Cluster, Cluster]
) -> None:
    primary, replica = primary_and_replica
    env = db_env(["127.0.0.1"], [primary.port], leasing={"READ_DATABASE": "replica"})
    env.update(HA_REPLICA_HOST="127.0.0.1", HA_REPLICA_PORT=str(replica.port))
    fleet.env.update(env)
    fleet.manage("migrate", "-v", "0", env={"HA_LEASING": "{}"})
    fleet.manage("ha_enqueue", "--count", "20", "--input", json.dumps({"sleep": 0.05}))
    worker = fleet.start("worker", "runworker", "--burst")
    assert worker.popen.wait(timeout=120) == 0, fleet.tails()
    item, task = query(primary.dsn(), "SELECT work_item_id, task_id FROM work_items LIMIT 1")[0]
    wait_until(
        lambda: (
            scalar(replica.dsn(), "SELECT count(*) FROM work_items WHERE status = 'completed'")
            == 20
        ),
        timeout=30,
    )
    # The worker's claims, renewals and completions all went to the primary:
    # the replica is read-only, so a single write sent there would have failed
    # the burst run above; and every item is completed on the primary.
    assert scalar(primary.dsn(), "SELECT count(*) FROM work_items WHERE status = 'completed'") == 20

    # Freeze the replica, then change the primary: an item held by a worker
    # and two waiting behind it exist on the primary only.
    replica.execute("SELECT pg_wal_replay_pause()")
    wait_until(
        lambda: scalar(replica.dsn(), "SELECT pg_get_wal_replay_pause_state()") == "paused",
        timeout=30,
    )
    paused_at = time.monotonic()
    fleet.manage(
        "ha_enqueue", "--count", "3", "--prefix", "late", "--input", json.dumps({"sleep": 600})
    )
    holder = fleet.start("holder", "runworker", "--concurrency", "1")
    held = wait_until(
        lambda: query(
            primary.dsn(), "SELECT work_item_id FROM work_items WHERE status = 'in_progress'"
        ),
        timeout=60,
        message=fleet.tails,
    )[0][0]
    # The holder wedges, as the workers operators force-release do: its
    # heartbeats stop. A live holder renews every second here, and a renewal
    # between the confirmation page and the POST rightly skips the item
    # (tests/db/test_admin.py covers that), which a slow host made happen.
    wedge(holder, primary)
    # Two seconds of lag at least, whatever the machine's speed.
    time.sleep(max(0.0, 2.0 - (time.monotonic() - paused_at)))

    report = probe(fleet, "--item", item, "--task", task, "--force-release", held)
    assert_served_by_replica(report)
    # The pages show the replica's data: no late item at all, nothing in progress.
    samples = report["metrics"]["samples"]
    assert samples['leasing_work_items{status="completed"}'] == 20, samples
    assert samples['leasing_work_items{status="pending"}'] == 0, samples
    assert samples['leasing_work_items{status="in_progress"}'] == 0, samples
    # ... and how old it is.
    assert samples["leasing_read_replica_replay_paused"] == 1, samples
    assert samples["leasing_read_replica_lag_seconds"] >= 2, samples
    assert samples["leasing_read_replica_lag_bytes"] > 0, samples
    lag = report["dashboard"]["lag"]
    assert report["dashboard"]["mentions_lag"], "the dashboard shows the replica's lag"
    assert lag["replica-alias"] == "replica", lag
    assert lag["replay-paused"] == "1", lag
    assert float(lag["lag-seconds"]) >= 2, lag
    assert int(lag["lag-bytes"]) > 0, lag

    # Force-release of an item the replica has never seen: the confirmation
    # page read it (and its lease token) on the primary, and the fenced
    # release was applied there.
    action = report["force_release"]
    assert action["confirmation"]["status"] == 200, action
    assert action["confirmation_lists_item"], action
    assert action["confirm"]["status"] == 302, action
    assert any("released" in m for m in action["messages"]), action["messages"]
    for step in ("confirmation", "confirm"):
        assert not action[step]["writes"].get("replica"), action
    assert {"work_items", "checkpoints"} <= set(action["confirm"]["writes"]["default"]), action
    transitions = scalar(
        primary.dsn(),
        "SELECT count(*) FROM checkpoints WHERE work_item_id = %s "
        "AND checkpoint_type = 'state_transition'",
        (held,),
    )
    assert transitions == 1
    late_on_replica = "SELECT count(*) FROM work_items WHERE task_id LIKE %s"
    assert scalar(replica.dsn(), late_on_replica, ("late-%",)) == 0

    # Replay resumed: the replica catches up and the page says so.
    fleet.kill_all()
    replica.execute("SELECT pg_wal_replay_resume()")
    wait_until(
        lambda: scalar(replica.dsn(), "SELECT count(*) FROM checkpoints WHERE work_item_id = %s",
                       (held,)) >= 1,
        timeout=30,
    )  # fmt: skip
    caught_up = probe(fleet)
    assert_served_by_replica(caught_up)
    after = caught_up["dashboard"]["lag"]
    assert after["replay-paused"] == "0", after
    # Nothing writes any more: the replica has replayed everything (a few
    # seconds of slack for WAL the server itself writes meanwhile).
    assert float(after["lag-seconds"] or "inf") < 5, after
    assert caught_up["metrics"]["samples"]['leasing_work_items{status="pending"}'] >= 2
    record_result(
        "replica-console",
        lag_paused=lag,
        lag_resumed=after,
        metrics_lag_seconds=samples["leasing_read_replica_lag_seconds"],
    )
