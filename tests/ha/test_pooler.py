"""A transaction pooler: 50 worker processes share 10 server connections through pgbouncer.

Claims, renewals, checkpoints, `run_once` and the sweep all go through
pgbouncer in transaction mode, which gives each transaction whichever server
connection is free: nothing may rely on session state, session advisory locks
or server-side prepared statements. LISTEN needs a session of its own, so the
listener uses the direct alias named by `LEASING["LISTEN_DATABASE"]`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from .clusters import Cluster
from .helpers import (
    audit,
    db_env,
    query,
    record_result,
    registered_workers,
    scalar,
    wait_until,
)
from .pooler import PgBouncer
from .processes import Fleet

WORKERS = int(os.environ.get("HA_POOLER_WORKERS", "50"))
ITEMS = int(os.environ.get("HA_POOLER_ITEMS", "20000"))
POOL = 10
# Every item records its execution in a file; every EVERYth item also runs a
# run_once effect and writes a checkpoint through the pooler.
EVERY = 10
# 50 processes on a small machine and a queue in front of 10 server connections:
# a renewal can wait seconds for its turn, so the lease is the production
# rule of thumb (well above the worst wait), not the failover tests' 5 s.
LOADED_LEASING = {"LEASE_DURATION": 30, "HEARTBEAT_INTERVAL": 3, "POLL_INTERVAL": 1.0}
# Polling stays slow so that a prompt start can only come from NOTIFY.
IDLE_POLL = 10.0


@pytest.fixture(scope="module")
def pooled() -> Iterator[tuple[Cluster, PgBouncer]]:
    # Room for 50 workers' direct connections in the run without the pooler.
    cluster = Cluster.create_primary("pool", settings={"max_connections": "300"})
    try:
        with PgBouncer(cluster, pool_size=POOL) as bouncer:
            yield cluster, bouncer
    finally:
        cluster.drop()


def _env(cluster: Cluster, bouncer: PgBouncer | None, **leasing: object) -> dict[str, str]:
    settings = dict(leasing)
    if bouncer is not None:
        # LISTEN does not hold through a transaction pooler: idle workers wait
        # for NOTIFY on a direct session instead.
        settings["LISTEN_DATABASE"] = "direct"
    port = bouncer.port if bouncer is not None else cluster.port
    return db_env(
        ["127.0.0.1"],
        [port],
        pooled=bouncer is not None,
        direct=("127.0.0.1", cluster.port),
        leasing=settings,
    )


def _reset(cluster: Cluster, fleet: Fleet) -> None:
    if not cluster.execute("SELECT to_regclass('work_items')")[0][0]:
        fleet.manage(
            "migrate", "-v", "0", env={"HA_DB_PORT": str(cluster.port), "HA_DB_POOLED": "0"}
        )
    cluster.execute(
        "DROP TABLE IF EXISTS ha_ledger; "
        "TRUNCATE work_items, checkpoints, idempotency_keys, workers CASCADE"
    )


def _pool_state(bouncer: PgBouncer) -> tuple[int, float]:
    """Server connections in use or open, and the longest wait of a queued client (s)."""
    pools = [p for p in bouncer.show("POOLS") if p["database"] == bouncer.cluster.dbname]
    servers = sum(p["sv_active"] + p["sv_idle"] + p["sv_used"] + p["sv_tested"] for p in pools)
    wait = max((p["maxwait"] + p["maxwait_us"] / 1e6 for p in pools), default=0.0)
    return servers, wait


def _run(fleet: Fleet, cluster: Cluster, bouncer: PgBouncer | None, label: str) -> dict[str, float]:
    """50 workers x 1 thread and a sweep on ITEMS items; returns the run's figures."""
    _reset(cluster, fleet)
    runs = fleet.run_dir / f"{label}-runs.txt"
    runs.unlink(missing_ok=True)
    fleet.env.update(_env(cluster, bouncer, **LOADED_LEASING), HA_RUNS=str(runs))
    dsn = cluster.dsn()
    began = time.monotonic()
    workers = [
        fleet.start(f"{label}-worker-{i}", "runworker", "--concurrency", "1")
        for i in range(WORKERS)
    ]
    sweep = fleet.start(f"{label}-sweep", "recoverysweep")
    wait_until(
        lambda: registered_workers(dsn) == WORKERS, timeout=180, interval=1, message=fleet.tails
    )
    startup = time.monotonic() - began
    peak_servers, peak_wait = 0, 0.0
    stop_sampling = threading.Event()

    def sample() -> None:
        nonlocal peak_servers, peak_wait
        while not stop_sampling.wait(0.2):
            servers, wait = _pool_state(bouncer)
            peak_servers, peak_wait = max(peak_servers, servers), max(peak_wait, wait)

    sampler = threading.Thread(target=sample, daemon=True)
    if bouncer is not None:
        sampler.start()
    try:
        fleet.manage(
            "ha_enqueue",
            *("--count", str(ITEMS), "--prefix", label),
            *("--effect-every", str(EVERY), "--checkpoint-every", str(EVERY)),
        )
        wait_until(
            lambda: (
                scalar(dsn, "SELECT count(*) FROM work_items WHERE status = 'completed'") == ITEMS
            ),
            timeout=300,
            interval=1,
            message=fleet.tails,
        )
    finally:
        stop_sampling.set()
    seconds = scalar(
        dsn, "SELECT extract(epoch FROM max(completed_at) - min(created_at)) FROM work_items"
    )
    result = audit(dsn)
    reclaimed = scalar(dsn, "SELECT count(*) FROM work_items WHERE lease_token > 1")
    crashed = [p.name for p in [*workers, sweep] if not p.alive()]
    codes = fleet.stop_many([*workers, sweep])
    assert not crashed, f"{label}: exited while running: {crashed}\n{fleet.tails()}"
    assert result.statuses == {"completed": ITEMS}, (label, result)
    # Every item ran exactly once (no lease was lost and run again under the load)...
    executions = Counter(line.split()[0] for line in runs.read_text().splitlines())
    assert len(executions) == ITEMS and set(executions.values()) == {1}, (
        label,
        len(executions),
        executions.most_common(3),
    )
    # ... and the run_once effects and checkpoints went through the pooler once each.
    assert result.effects == ITEMS // EVERY == result.ledger_rows, (label, result)
    assert result.keys_not_completed == 0, (label, result)
    checkpoints = scalar(
        dsn, "SELECT count(*) FROM checkpoints WHERE checkpoint_type = 'iteration_end'"
    )
    assert checkpoints == ITEMS // EVERY, (label, checkpoints)
    bad_exits = {name: code for name, code in codes.items() if code != 0}
    assert not bad_exits, f"{label}: non-zero exits on SIGTERM: {bad_exits}\n{fleet.tails()}"
    if bouncer is not None:
        assert 0 < peak_servers <= POOL, peak_servers
    return {
        "startup_s": round(startup, 1),
        "seconds": round(float(seconds), 2),
        "items_per_s": round(ITEMS / float(seconds), 1),
        "peak_server_connections": peak_servers,
        "peak_pool_wait_s": round(peak_wait, 3),
        "reclaimed_items": reclaimed,
    }


def test_fifty_workers_through_pool_of_ten_exactly_once(
    fleet: Fleet, pooled: tuple[Cluster, PgBouncer]
) -> None:
    cluster, bouncer = pooled
    through_pooler = _run(fleet, cluster, bouncer, "pooled")
    direct = _run(fleet, cluster, None, "direct")
    stats = {row["database"]: row for row in bouncer.show("STATS")}.get(cluster.dbname, {})
    record_result(
        "pooler",
        workers=WORKERS,
        items=ITEMS,
        pool_size=POOL,
        pooled=through_pooler,
        direct=direct,
        pooled_vs_direct=round(through_pooler["items_per_s"] / direct["items_per_s"], 2),
        pgbouncer_transactions=int(stats.get("total_xact_count") or 0),
    )


def test_enqueue_wakes_pooled_workers_through_the_direct_listener(
    fleet: Fleet, pooled: tuple[Cluster, PgBouncer]
) -> None:
    cluster, bouncer = pooled
    _reset(cluster, fleet)
    fleet.env.update(_env(cluster, bouncer, POLL_INTERVAL=IDLE_POLL))
    for i in range(3):
        fleet.start(f"idle-worker-{i}", "runworker")
    wait_until(lambda: registered_workers(cluster.dsn()) == 3, timeout=60, message=fleet.tails)
    # Every worker has had its first (empty) claim and is now waiting.
    time.sleep(3)
    listeners = scalar(
        cluster.dsn(),
        "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%%' AND state = 'idle'",
    )
    fleet.manage("ha_enqueue", "--count", "1", "--prefix", "wake", "--input", json.dumps({}))
    wait_until(
        lambda: query(cluster.dsn(), "SELECT 1 FROM work_items WHERE status = 'completed'"),
        timeout=IDLE_POLL * 2,
        interval=0.05,
    )
    # From the enqueue's commit (which sends the NOTIFY) to the claim.
    latency = float(
        scalar(cluster.dsn(), "SELECT extract(epoch FROM started_at - created_at) FROM work_items")
    )
    # Only the workers' elected leader listens (a NOTIFY wakes one worker, not all), on
    # a session of its own on the server: LISTEN cannot pass pgbouncer in transaction
    # mode, so a wake well under the poll interval is the direct listener's.
    record_result("pooler-notify", latency_s=round(latency, 2), direct_listeners=listeners)
    # Polling alone would take up to IDLE_POLL seconds (half of it on average).
    assert latency < 1.0, latency
