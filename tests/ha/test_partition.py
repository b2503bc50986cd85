"""Worker hosts in network namespaces: a partition mid-lease, and a slow link.

Each "host" is a network namespace on the test bridge; the database listens
on the bridge. Workers there run `manage.py runworker` exactly as on another
machine; the sweep runs on the database's side of the bridge.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .clusters import Cluster
from .helpers import audit, db_env, query, record_result, scalar, wait_until
from .network import GATEWAY, TestNetwork
from .processes import Fleet

# Failures need to be noticed in seconds: libpq gives up on an unanswered
# connection after 2 s (connect_timeout, tcp_user_timeout).
TCP_TIMEOUT_MS = 2000
PARTITION_LEASING = {"LEASE_DURATION": 8, "HEARTBEAT_INTERVAL": 1, "HEARTBEAT_MAX_FAILURES": 3}


@pytest.fixture
def lan(fleet: Fleet) -> Iterator[tuple[TestNetwork, Cluster]]:
    with TestNetwork() as net:
        cluster = Cluster.create_primary("net", listen=("127.0.0.1", GATEWAY))
        try:
            yield net, cluster
        finally:
            fleet.kill_all()  # processes inside the namespaces go before the network
            cluster.drop()


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _find(events: list[dict[str, Any]], name: str, token: int | None = None) -> dict | None:
    for event in events:
        if event["event"] == name and (token is None or event["token"] == token):
            return event
    return None


def test_partitioned_worker_loses_lease_and_rejoins_without_duplicate(
    fleet: Fleet, lan: tuple[TestNetwork, Cluster]
) -> None:
    net, cluster = lan
    host_a, host_b = net.add_host("a"), net.add_host("b")
    events_file = fleet.run_dir / "events.jsonl"
    local = db_env(["127.0.0.1"], [cluster.port], leasing=PARTITION_LEASING)
    remote = db_env(
        [GATEWAY], [cluster.port], leasing=PARTITION_LEASING, tcp_timeout_ms=TCP_TIMEOUT_MS
    )
    fleet.env.update(local, HA_EVENTS=str(events_file))
    dsn = cluster.dsn()
    fleet.manage("migrate", "-v", "0")
    fleet.manage(
        "ha_enqueue",
        *("--count", "1", "--work-type", "ha.steps", "--prefix", "partition"),
        *("--input", json.dumps({"steps": 4, "pause_after": 1, "pause": 90})),
    )
    fleet.start("sweep", "recoverysweep")
    worker_a = fleet.start("worker-a", "runworker", host=host_a, env=remote)
    paused = wait_until(
        lambda: _find(_events(events_file), "pausing"), timeout=60, message=fleet.tails
    )
    a_id = paused["worker"]

    net.cut(host_a)
    cut_at = time.time()
    worker_b = fleet.start("worker-b", "runworker", host=host_b, env=remote)

    # A learns from its own failed renewals that the lease is gone, and every
    # write it then tries is refused without reaching the database.
    lost = wait_until(
        lambda: _find(_events(events_file), "lease_lost_seen", token=1),
        timeout=60,
        message=fleet.tails,
    )
    refused = wait_until(lambda: _find(_events(events_file), "write_refused", token=1), timeout=10)
    # B gets the item once the sweep has recovered it, resumes after step 1.
    wait_until(
        lambda: scalar(dsn, "SELECT status FROM work_items") == "completed",
        timeout=90,
        message=fleet.tails,
    )
    completed_at = time.time()
    item = query(dsn, "SELECT lease_token, retry_count, lease_holder FROM work_items")[0]
    b_id = scalar(dsn, "SELECT worker_id FROM ha_ledger WHERE lease_token = 2 LIMIT 1")

    net.heal(host_a)
    healed_at = time.time()
    # A rejoins: with B gone, new work can only be done by A.
    fleet.stop(worker_b)
    fleet.manage("ha_enqueue", "--count", "5", "--prefix", "after-heal")
    wait_until(
        lambda: scalar(dsn, "SELECT count(*) FROM work_items WHERE status = 'completed'") == 6,
        timeout=60,
        message=fleet.tails,
    )
    result = audit(dsn)
    events = _events(events_file)
    record_result(
        "partition",
        cut_to_lease_lost_seen_s=round(lost["at"] - cut_at, 2),
        cut_to_completed_elsewhere_s=round(completed_at - cut_at, 2),
        heal_to_rejoined_work_s=round(time.time() - healed_at, 2),
        lease_lost_reason=lost["reason"][:200],
    )

    assert worker_a.alive(), f"A must ride out the partition\n{fleet.tails()}"
    assert _find(events, "write_accepted") is None, events
    assert refused["token"] == 1
    # The item was finished by B under the next lease; each step's effect once.
    assert item[0] == 2, item
    assert b_id is not None and b_id != a_id
    steps = query(
        dsn,
        "SELECT effect_key, lease_token, worker_id, created_at FROM ha_ledger "
        "WHERE effect_key LIKE 'step:%%' ORDER BY effect_key",
    )
    assert [(key.rsplit(":", 1)[1], token) for key, token, _w, _at in steps] == [
        ("0", 1),
        ("1", 1),
        ("2", 2),
        ("3", 2),
    ], steps
    # A wrote nothing once its link was cut: no effect, no checkpoint, no failure record.
    assert all(at.timestamp() < cut_at for _k, token, _w, at in steps if token == 1)
    assert not query(dsn, "SELECT 1 FROM checkpoints WHERE snapshot_data ? 'zombie'")
    # The error_boundary records of A's attempt: the sweep's, which names the
    # holder of the lease it recovered (A, token 1, lease_expired), and no
    # other: one written by A itself would have another reason.
    boundaries = query(
        dsn,
        "SELECT snapshot_data->>'reason', (snapshot_data->>'lease_token')::int "
        "FROM checkpoints WHERE checkpoint_type = 'error_boundary' "
        "AND snapshot_data->>'worker_id' = %s",
        (a_id,),
    )
    assert boundaries == [("lease_expired", 1)], boundaries
    assert (
        scalar(dsn, "SELECT count(*) FROM checkpoints WHERE checkpoint_type = 'iteration_end'") == 4
    )
    # After the heal: A did the new work, and no effect happened twice.
    assert (
        scalar(
            dsn,
            "SELECT count(*) FROM ha_ledger WHERE effect_key LIKE 'effect:after-heal%%' "
            "AND worker_id = %s",
            (a_id,),
        )
        == 5
    )
    assert result.ledger_rows == result.effects == 9, result
    assert result.statuses == {"completed": 6}, result


def test_slow_link_claims_and_renewals_keep_every_lease(
    fleet: Fleet, lan: tuple[TestNetwork, Cluster]
) -> None:
    net, cluster = lan
    host_c = net.add_host("c")
    address, port = net.delay(host_c, 100, db_port=cluster.port)
    rtt = net.measure_rtt(host_c, address, port, cluster.dbname)
    # The renewer extends a lease once less than half of it is left, at its next
    # tick (1 s), over a few 200 ms round trips: about 1.4 s of margin for a
    # renewal delayed by a loaded host (a 3 s lease left about 0.5 s).
    leasing = {"LEASE_DURATION": 6, "HEARTBEAT_INTERVAL": 1, "HEARTBEAT_MAX_FAILURES": 3}
    fleet.env.update(db_env(["127.0.0.1"], [cluster.port], leasing=leasing))
    dsn = cluster.dsn()
    fleet.manage("migrate", "-v", "0")
    # Each handler runs 9 s, half as long again as its 6 s lease: only renewals keep it.
    fleet.manage("ha_enqueue", "--count", "8", "--input", json.dumps({"sleep": 9}))
    fleet.start("sweep", "recoverysweep")
    fleet.start(
        "worker-c",
        "runworker",
        "--concurrency",
        "4",
        host=host_c,
        env=db_env([address], [port], leasing=leasing, tcp_timeout_ms=5000),
    )
    worst_margin = float("inf")
    deadline = time.monotonic() + 120
    while scalar(dsn, "SELECT count(*) FROM work_items WHERE status = 'completed'") < 8:
        assert time.monotonic() < deadline, fleet.tails()
        margin = scalar(
            dsn,
            "SELECT min(extract(epoch FROM lease_expires_at - statement_timestamp())) "
            "FROM work_items WHERE status = 'in_progress'",
        )
        if margin is not None:
            worst_margin = min(worst_margin, float(margin))
        time.sleep(0.1)
    rows = query(dsn, "SELECT lease_token, retry_count FROM work_items")
    result = audit(dsn)
    record_result(
        "slow-link",
        round_trip_s=round(rtt, 3),
        relay=not net.uses_netem(),
        lease_s=leasing["LEASE_DURATION"],
        worst_lease_margin_s=round(worst_margin, 2),
    )
    assert rtt >= 0.19, f"the link is not slowed: {rtt:.3f} s round trip"
    assert worst_margin > 0, "a lease ran out while its handler was running"
    assert rows == [(1, 0)] * 8, rows  # never re-claimed, never retried
    assert result.ledger_rows == result.effects == 8, result
    assert not query(dsn, "SELECT 1 FROM checkpoints WHERE checkpoint_type = 'error_boundary'")
