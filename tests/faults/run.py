"""One fault run, from a new cluster to the checked report.

    result = fault_run(RunConfig.from_environment())
    assert result.passed, result.text

1. A throwaway cluster (`tests.ha.clusters`, named `lfx_faults`) and pgbouncer in
   transaction mode in front of it (`tests.ha.pooler`); the schema, the
   journal's trigger and the effect ledger (`tests.faults.journal`).
2. Workers (`runworker`, two direct, one of them with its clock skewed, two
   through pgbouncer), two `recoverysweep`, two `runscheduler` (one skewed)
   and the producer (`faults_produce`), kept running by the supervisor.
3. The injector's faults for `FAULTS_SECONDS`; then the producer and the
   schedulers stop, and the workers and sweeps get up to `FAULTS_SETTLE_SECONDS`
   to bring every item to an end, with no more faults.
4. Everything stops; the checker reads the journal, the ledger, the items and
   the processes' records, and the report is written.

The shared PostgreSQL server is never touched.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.ha.clusters import PREFIX, Cluster, drop_cluster
from tests.ha.helpers import db_env, registered_workers, scalar, wait_until
from tests.ha.pooler import PgBouncer
from tests.ha.processes import ROOT, Fleet, base_env

from . import journal
from .checker import Rules, check
from .injector import Injector
from .report import Report, summarize
from .supervisor import Role, Supervisor
from .workload import CAPS, LEASING, MAX_LEASE_LIFETIME, QUEUE_LIMITS, RECOVERY_BOUND

ARTIFACTS = ROOT / "artifacts" / "faults"
CLUSTER = "faults"
DBNAME = "leasing_faults"
RULES = Rules(
    queue_limits=QUEUE_LIMITS,
    caps=CAPS,
    default_cap=MAX_LEASE_LIFETIME,
    recovery_bound=RECOVERY_BOUND,
)
SKEWED_WORKER = "worker-skewed"


@dataclass(frozen=True)
class RunConfig:
    seconds: float  # of faults
    settle: float  # the most the system gets to finish its items afterwards
    seed: int
    concurrency: int = 4  # handler threads per worker
    skew: float = 600.0  # seconds the skewed processes' clocks are off

    @classmethod
    def from_environment(cls) -> RunConfig:
        return cls(
            seconds=float(os.environ.get("FAULTS_SECONDS", "180")),
            settle=float(os.environ.get("FAULTS_SETTLE_SECONDS", "90")),
            seed=int(os.environ.get("FAULTS_SEED") or time.time_ns() % 1_000_000),
        )


def _roles(config: RunConfig, cluster: Cluster, bouncer: PgBouncer) -> list[Role]:
    def env(name: str, *, pooled: bool, skew: float = 0.0) -> dict[str, str]:
        leasing = {**LEASING, **({"LISTEN_DATABASE": "direct"} if pooled else {})}
        return {
            **db_env(
                ["127.0.0.1"],
                [bouncer.port if pooled else cluster.port],
                dbname=DBNAME,
                pooled=pooled,
                direct=("127.0.0.1", cluster.port),
                leasing=leasing,
            ),
            "FAULTS_PROC": name,
            "FAULTS_CLOCK_SKEW": f"{skew:+g}",
        }

    worker = ("runworker", "--concurrency", str(config.concurrency))
    scheduler = ("runscheduler",)
    layout = [
        ("worker-direct", "worker", worker, False, 0.0),
        (SKEWED_WORKER, "worker", worker, False, config.skew),
        ("worker-pooled-1", "worker", worker, True, 0.0),
        ("worker-pooled-2", "worker", worker, True, 0.0),
        ("sweep-direct", "sweep", ("recoverysweep",), False, 0.0),
        ("sweep-pooled", "sweep", ("recoverysweep",), True, 0.0),
        ("scheduler-direct", "scheduler", scheduler, False, 0.0),
        ("scheduler-pooled-skewed", "scheduler", scheduler, True, -config.skew),
    ]
    roles = [
        Role(name, kind, args, env(name, pooled=pooled, skew=skew))
        for name, kind, args, pooled, skew in layout
    ]
    produce = ("faults_produce", "--seconds", str(config.seconds), "--seed", str(config.seed))
    roles.append(Role("producer", "producer", produce, env("producer", pooled=False), False))
    return roles


def _unfinished(dsn: str) -> int:
    return int(
        scalar(dsn, "SELECT count(*) FROM work_items WHERE status NOT IN ('completed', 'failed')")
    )


def fault_run(config: RunConfig, run_dir: Path = ARTIFACTS) -> Report:
    began = time.monotonic()
    shutil.rmtree(run_dir, ignore_errors=True)
    records = run_dir / "records"
    records.mkdir(parents=True)
    # Only a cluster of this run's own name that a crashed run left behind.
    drop_cluster(PREFIX + CLUSTER)
    cluster = Cluster.create_primary(CLUSTER, dbname=DBNAME, settings={"max_connections": "200"})
    supervisor: Supervisor | None = None
    fleet = Fleet(
        run_dir / "logs",
        base_env(DJANGO_SETTINGS_MODULE="tests.faults.settings", FAULTS_RECORDS=str(records)),
    )
    try:
        with PgBouncer(cluster, pool_size=8) as bouncer:
            roles = _roles(config, cluster, bouncer)
            fleet.manage("migrate", "-v", "0", env=roles[0].env)
            journal.install(cluster.dsn())
            supervisor = Supervisor(fleet, roles)
            supervisor.start()
            workers = sum(1 for r in roles if r.kind == "worker")
            wait_until(
                lambda: registered_workers(cluster.dsn()) >= workers,
                timeout=90,
                message=fleet.tails,
            )
            injector = Injector(
                cluster,
                bouncer,
                supervisor,
                random.Random(config.seed),
                run_dir / "faults.log",
                SKEWED_WORKER,
            )
            injector.run(config.seconds)
            settle_began = time.monotonic()
            supervisor.retire("producer")
            supervisor.retire("scheduler")
            settled = _settle(cluster.dsn(), config.settle)
            settle_seconds = time.monotonic() - settle_began
            supervisor.stop()
            journal.dump(cluster.dsn(), run_dir / "database")
            evidence = journal.load_evidence(cluster.dsn(), records)
            found, peaks = check(evidence, RULES)
            context: dict[str, Any] = {
                "config": config,
                "injector": injector,
                "supervisor": supervisor,
                "settled": settled,
                "settle_seconds": settle_seconds,
                "wall_seconds": time.monotonic() - began,
                "dsn": cluster.dsn(),
                "logs": fleet.run_dir,
            }
            return summarize(evidence, found, peaks, RULES, context)
    finally:
        if supervisor is not None:
            supervisor.stop()
        fleet.kill_all()
        with contextlib.suppress(OSError):
            shutil.copy(cluster.logfile, run_dir / "postgresql.log")
        cluster.drop()


def _settle(dsn: str, seconds: float) -> bool:
    """Wait (no more faults) until no item is pending or in progress; True if so."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _unfinished(dsn) == 0:
            return True
        time.sleep(1)
    return _unfinished(dsn) == 0
