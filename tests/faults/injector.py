"""The faults: one every 1-3 seconds, drawn at random (seeded) once each kind has run.

- `kill_worker`, `kill_sweep`, `kill_scheduler`: SIGKILL one such process (the
  supervisor starts it again, as a process manager would);
- `terminate_backends`: `pg_terminate_backend` on 1-3 of the run's backends
  (workers', sweeps', schedulers', the producer's, pgbouncer's server connections);
- `terminate_listeners`: the same on the workers' LISTEN sessions;
- `restart_postgres`: a fast shutdown and a start;
- `crash_postgres`: SIGKILL of the postmaster and every backend, then a start
  (crash recovery);
- `restart_pgbouncer`: stop the pooler the pooled workers go through, start it again;
- `skew_clock`: restart the skewed worker with its skew reversed (it is always skewed).

Only the run's own throwaway cluster and pgbouncer are ever touched.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import psycopg

from leasing.sql.wakes import LISTENING
from tests.ha.clusters import VERSION, Cluster, _alive, _children, run
from tests.ha.helpers import wait_until
from tests.ha.pooler import PgBouncer

from .supervisor import Supervisor

FAULTS = (
    "kill_worker",
    "kill_sweep",
    "kill_scheduler",
    "terminate_backends",
    "terminate_listeners",
    "restart_postgres",
    "crash_postgres",
    "restart_pgbouncer",
    "skew_clock",
)
WEIGHTS = (4, 1.5, 1, 4, 1.5, 0.5, 0.5, 1, 0.5)
INJECTOR_APP = "faults-injector"


class Injector:
    def __init__(
        self,
        cluster: Cluster,
        bouncer: PgBouncer,
        supervisor: Supervisor,
        rng: random.Random,
        log: Path,
        skewed_role: str,
    ) -> None:
        self.cluster = cluster
        self.bouncer = bouncer
        self.supervisor = supervisor
        self.rng = rng
        self.log_path = log
        self.skewed_role = skewed_role
        self.counts: Counter[str] = Counter()  # faults injected, by kind
        self.effects: Counter[str] = Counter()  # what they did (backends ended, ...)
        self.started = time.monotonic()

    def log(self, text: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(f"{time.monotonic() - self.started:8.2f} {text}\n")

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        plan = list(FAULTS)
        self.rng.shuffle(plan)
        while True:
            pause = self.rng.uniform(1.0, 3.0)
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            planned = bool(plan)
            kind = plan.pop() if planned else self.rng.choices(FAULTS, WEIGHTS)[0]
            try:
                detail = getattr(self, kind)()
            except (psycopg.Error, RuntimeError) as exc:
                self.effects[f"{kind}_failed"] += 1
                self.log(f"{kind}: FAILED: {exc}")
                self.restore()  # raises if the servers cannot be brought back
                continue
            if detail is None:
                self.log(f"{kind}: nothing to do")
                if planned:
                    plan.insert(0, kind)  # every kind once: try it again later
                continue
            self.counts[kind] += 1
            self.log(f"{kind}: {detail}")
        time.sleep(max(0.0, deadline - time.monotonic()))

    # --- processes ---------------------------------------------------------------------------

    def _kill_one(self, kind: str) -> str | None:
        roles = self.supervisor.alive(kind)
        if not roles:
            return None
        role = self.rng.choice(roles)
        self.supervisor.kill(role)
        return f"SIGKILL {role.name} (pid {role.proc.pid if role.proc else '?'})"

    def kill_worker(self) -> str | None:
        return self._kill_one("worker")

    def kill_sweep(self) -> str | None:
        return self._kill_one("sweep")

    def kill_scheduler(self) -> str | None:
        return self._kill_one("scheduler")

    def skew_clock(self) -> str | None:
        role = next(r for r in self.supervisor.roles if r.name == self.skewed_role)
        skew = -float(role.env.get("FAULTS_CLOCK_SKEW", "0"))
        self.supervisor.kill(role, env={"FAULTS_CLOCK_SKEW": f"{skew:+g}"})
        self.effects["skew_changes"] += 1
        return f"{role.name} restarted with its clock {skew:+g} s off"

    # --- backends ----------------------------------------------------------------------------

    def _terminate(self, condition: str, most: int, counter: str) -> str | None:
        """End 1..`most` of the run's backends that match `condition`; count them."""
        with self.cluster.connect("postgres", application_name=INJECTOR_APP) as conn:
            rows = conn.execute(
                "SELECT pid, application_name FROM pg_stat_activity "
                "WHERE datname = %s AND backend_type = 'client backend' "
                f"AND application_name <> %s AND pid <> pg_backend_pid() AND {condition}",
                (self.cluster.dbname, INJECTOR_APP),
            ).fetchall()
            if not rows:
                return None
            chosen = self.rng.sample(rows, min(len(rows), self.rng.randint(1, most)))
            ended = [
                f"{pid} ({name or 'via pgbouncer'})"
                for pid, name in chosen
                if conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
            ]
        if not ended:
            return None
        self.effects[counter] += len(ended)
        return f"ended {len(ended)} of {len(rows)}: {', '.join(ended)}"

    def terminate_backends(self) -> str | None:
        return self._terminate("TRUE", 3, "backends_ended")

    def terminate_listeners(self) -> str | None:
        return self._terminate(LISTENING, 2, "listen_sessions_ended")

    # --- servers -----------------------------------------------------------------------------

    def restart_postgres(self) -> str:
        began = time.monotonic()
        name = self.cluster.name
        run("pg_ctlcluster", "--skip-systemctl-redirect", VERSION, name, "restart", "-m", "fast")
        self.cluster.wait_ready()
        return f"restarted (fast shutdown); down {time.monotonic() - began:.1f} s"

    def crash_postgres(self) -> str:
        began = time.monotonic()
        pid = self.cluster.postmaster_pid()
        victims = [] if pid is None else [pid, *_children(pid)]
        self.cluster.kill()
        # PostgreSQL refuses to start while a killed postmaster's pid is still alive
        # (its socket lock file names it): wait for the kills to land.
        wait_until(lambda: not any(_alive(victim) for victim in victims), timeout=30, interval=0.05)
        self.cluster.start()
        down = time.monotonic() - began
        return f"crashed (SIGKILL of the postmaster and backends), started; down {down:.1f} s"

    def restore(self) -> None:
        """After a fault that failed half-way: PostgreSQL and pgbouncer up, or raise."""
        try:
            self.cluster.wait_ready(timeout=2)
        except psycopg.Error:
            pid = self.cluster.postmaster_pid()
            if pid is not None and _alive(pid):
                self.cluster.wait_ready(timeout=30)
            else:
                self.cluster.start()
        if self.bouncer.proc is None or self.bouncer.proc.poll() is not None:
            self.bouncer.stop()
            self.bouncer.start()

    def restart_pgbouncer(self) -> str:
        began = time.monotonic()
        self.bouncer.stop()
        self.bouncer.start()
        return f"pgbouncer restarted; down {time.monotonic() - began:.1f} s"
