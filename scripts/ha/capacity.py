"""Capacity figure: throughput against worker processes, through pgbouncer (make ha-capacity).

    .venv/bin/python scripts/ha/capacity.py [--workers 1,2,4,8,16,32] [--items 3000]

Builds a throwaway cluster whose `max_connections` (40) is below what 32
workers would open directly (about 4 connections each), puts pgbouncer in
transaction mode with a pool of 10 server connections in front of it, and for
each worker count drains the same number of `ha.effect` items (one `run_once`
side effect each: three commits) with `runworker --concurrency 1` processes.

For each run it prints the throughput (items / (last completed_at - first
created_at), database clock) and where the CPU went during the drain: the
PostgreSQL backends, the worker processes, pgbouncer, as a share of the
machine; how busy PostgreSQL's server connections were (share of 50 ms samples
of pg_stat_activity in which a backend was running or waiting inside
PostgreSQL, not for its client) and on what they waited most; and how much of
the time a WAL flush was under way. PostgreSQL is the limit where its
connections are busy nearly all the time; the last line says where that
happened in this run. Needs root (like make test-ha).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.ha.clusters import Cluster, drop_leftovers  # noqa: E402
from tests.ha.helpers import db_env, registered_workers, scalar, wait_until  # noqa: E402
from tests.ha.network import cleanup_network  # noqa: E402
from tests.ha.pooler import PgBouncer, kill_leftover_pgbouncers  # noqa: E402
from tests.ha.processes import Fleet, base_env  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), in seconds."""
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def sample(cluster: Cluster, bouncer_pid: int, worker_pids: list[int]) -> dict[str, dict]:
    postmaster = cluster.postmaster_pid() or 0
    return {
        "postgres": {p: cpu_seconds(p) for p in [postmaster, *children(postmaster)]},
        "workers": {p: cpu_seconds(p) for p in worker_pids},
        "pgbouncer": {p: cpu_seconds(p) for p in [bouncer_pid, *children(bouncer_pid)]},
    }


def wal_and_commits(cluster: Cluster) -> tuple[int, float, int]:
    """WAL flushes, seconds spent flushing WAL, and committed transactions so far."""
    syncs, sync_ms = cluster.execute("SELECT wal_sync, wal_sync_time FROM pg_stat_wal")[0]
    commits = scalar(
        cluster.dsn(), "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    )
    return int(syncs), float(sync_ms) / 1000, int(commits)


class BackendSampler:
    """Samples what the server connections do during a drain (pg_stat_activity, every 50 ms).

    `busy` is the share of samples in which a backend was running a statement
    or waiting inside PostgreSQL (for a WAL flush, a lock); the rest it was
    waiting for its client. Near 100% with every pooled connection in use,
    PostgreSQL is the limit; well below it, the workers are.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.samples: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BackendSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        with self.cluster.connect() as conn:
            while not self._stop.wait(0.05):
                rows = conn.execute(
                    "SELECT state, coalesce(wait_event_type || ':' || wait_event, 'CPU') "
                    "FROM pg_stat_activity WHERE backend_type = 'client backend' "
                    "AND datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchall()
                self.samples.extend(rows)

    def busy(self) -> float:
        active = sum(1 for state, _ in self.samples if state == "active")
        return active / max(1, len(self.samples))

    def top_wait(self) -> str:
        waits = Counter(wait for state, wait in self.samples if state == "active")
        return waits.most_common(1)[0][0] if waits else "-"


def used(before: dict[str, dict], after: dict[str, dict], group: str) -> float:
    # A process that started during the run counts from zero.
    return sum(cpu - before[group].get(pid, 0.0) for pid, cpu in after[group].items())


def drain(fleet: Fleet, cluster: Cluster, bouncer: PgBouncer, n: int, items: int) -> dict:
    cluster.execute(
        "DROP TABLE IF EXISTS ha_ledger; "
        "TRUNCATE work_items, checkpoints, idempotency_keys, workers CASCADE"
    )
    workers = [fleet.start(f"n{n}-worker-{i}", "runworker", "--concurrency", "1") for i in range(n)]
    dsn = cluster.dsn()
    wait_until(lambda: registered_workers(dsn) == n, timeout=180, interval=0.5)
    assert bouncer.proc is not None
    pids = [w.pid for w in workers]
    before = sample(cluster, bouncer.proc.pid, pids)
    wal_before, flushing_before, commits_before = wal_and_commits(cluster)
    started = time.monotonic()
    with BackendSampler(cluster) as backends:
        fleet.manage("ha_enqueue", "--count", str(items), "--prefix", f"n{n}")
        wait_until(
            lambda: (
                scalar(dsn, "SELECT count(*) FROM work_items WHERE status = 'completed'") == items
            ),
            timeout=900,
            interval=0.5,
        )
    wall = time.monotonic() - started
    after = sample(cluster, bouncer.proc.pid, pids)
    wal_after, flushing_after, commits_after = wal_and_commits(cluster)
    seconds = float(
        scalar(
            dsn, "SELECT extract(epoch FROM max(completed_at) - min(created_at)) FROM work_items"
        )
    )
    once = scalar(dsn, "SELECT count(*) = count(DISTINCT effect_key) FROM ha_ledger")
    fleet.stop_many(workers)
    machine = wall * CORES
    return {
        "workers": n,
        "items_per_s": items / seconds,
        "pg_cpu": used(before, after, "postgres") / machine,
        "worker_cpu": used(before, after, "workers") / machine,
        "bouncer_cpu": used(before, after, "pgbouncer") / machine,
        "exactly_once": bool(once),
        "commits_per_s": (commits_after - commits_before) / wall,
        "wal_flushes_per_s": (wal_after - wal_before) / wall,
        # Share of the drain during which a WAL flush was under way.
        "wal_busy": (flushing_after - flushing_before) / wall,
        "pg_busy": backends.busy(),
        "top_wait": backends.top_wait(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8,16,32")
    parser.add_argument("--items", type=int, default=1500)
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    if os.geteuid() != 0:
        sys.exit("capacity.py needs root (it creates a cluster and runs pgbouncer as postgres)")
    kill_leftover_pgbouncers()
    drop_leftovers()
    cleanup_network()
    fleet = Fleet(ROOT / "artifacts" / "ha" / "capacity", base_env())
    cluster = Cluster.create_primary(
        "cap", settings={"max_connections": "40", "track_wal_io_timing": "on"}
    )
    rows = []
    try:
        with PgBouncer(cluster, pool_size=10) as bouncer:
            fleet.env.update(
                db_env(
                    ["127.0.0.1"],
                    [bouncer.port],
                    pooled=True,
                    leasing={"LEASE_DURATION": 60, "HEARTBEAT_INTERVAL": 5, "POLL_INTERVAL": 1},
                )
            )
            fleet.manage("migrate", "-v", "0", env={"HA_DB_PORT": str(cluster.port)})
            print(
                f"{CORES} cores; PostgreSQL max_connections 40, synchronous_commit on; "
                f"pgbouncer transaction mode, pool 10; {args.items} items with one "
                "run_once effect each"
            )
            print(
                f"{'workers':>7} {'items/s':>8} {'commits/s':>9} {'WAL flush/s':>11} "
                f"{'WAL busy':>8} {'PG busy':>7} {'top wait':>16} {'PG CPU':>7} "
                f"{'workers CPU':>11} {'pgbouncer':>9} {'once':>5}"
            )
            for n in counts:
                row = drain(fleet, cluster, bouncer, n, args.items)
                rows.append(row)
                print(
                    f"{n:>7} {row['items_per_s']:>8.0f} {row['commits_per_s']:>9.0f} "
                    f"{row['wal_flushes_per_s']:>11.0f} {row['wal_busy']:>8.0%} "
                    f"{row['pg_busy']:>7.0%} {row['top_wait']:>16} "
                    f"{row['pg_cpu']:>7.0%} {row['worker_cpu']:>11.0%} "
                    f"{row['bouncer_cpu']:>9.0%} {'yes' if row['exactly_once'] else 'NO':>5}",
                    flush=True,
                )
    finally:
        fleet.kill_all()
        cluster.drop()
    best = max(rows, key=lambda r: r["items_per_s"])
    print(f"peak: {best['items_per_s']:.0f} items/s at {best['workers']} worker(s)")
    # PostgreSQL is the limit once its server connections are busy inside it
    # (running, or waiting for a WAL flush or a lock) nearly all the time.
    for row in rows:
        if row["pg_busy"] >= 0.8:
            print(
                f"PostgreSQL is the limit from {row['workers']} worker(s) on: its server "
                f"connections were busy {row['pg_busy']:.0%} of the time (mostly "
                f"{row['top_wait']}), flushing WAL {row['wal_busy']:.0%} of the time"
            )
            break
    else:
        print("PostgreSQL was not the limit at any count: its connections waited for clients")


if __name__ == "__main__":
    main()
