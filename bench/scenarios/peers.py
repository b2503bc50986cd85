"""peers: procrastinate, django-tasks-db, django-q2 and oban-py drain the no-op jobs runworker does.

Each peer runs from the bench-only virtualenv (`bench.peers.venv`) in its own
database on the same server, configured as its documentation shows and left at
its defaults (`bench.peers.site`, `bench.peers.oban`): `manage.py procrastinate
worker` and `manage.py db_worker` as N processes, django-q2 as one `qcluster`
with N workers (its unit of scale), oban-py as N `oban start` processes (its
CLI) at its documented queue limit of 10 and at limit 1 (one job at a time, as
the others run by default). P jobs (default 20,000) wait before each run, and
the processes start behind the same gate as the drains (a lock on the peer's
job table until every process waits on its first claim), right after an
ANALYZE of that table: every peer, like runworker, plans its claim far worse
on the statistics of an emptied table (django-tasks-db drained 2.3 times
slower), and this scenario compares how fast each drains, not how each copes
with a burst (`burst` measures that for runworker). The rate is the jobs
finished from the gate's release until all are done or W seconds (default 4)
have passed, counted every 0.1 s (every 5 ms once a drain is about to end) on
the database clock; the same for `runworker`
(default settings, N processes) in the bench database.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bench.common import (
    ROOT,
    BenchError,
    connect,
    drop_database,
    progress,
    recreate_database,
    subprocess_env,
    with_database,
)
from bench.config import TARGETS
from bench.context import Bench
from bench.drain import gate_and_start
from bench.report import Row


@dataclass(frozen=True)
class Peer:
    name: str
    worker: tuple[str, ...]  # the management command a user runs
    table: str  # the job table the gate locks
    remaining: str  # SQL: jobs not finished yet
    one_process: bool = False  # one process with N workers (django-q2's cluster)
    oban_limit: int | None = None  # oban-py: its CLI with this queue limit, not Django's


def _oban(limit: int) -> Peer:
    return Peer(
        f"oban (limit {limit})",
        ("-m", "oban", "start", "--queues", f"default:{limit}"),
        "oban_jobs",
        "SELECT count(*) FROM oban_jobs WHERE state IN ('available', 'executing')",
        oban_limit=limit,
    )


PEERS = (
    Peer(
        "procrastinate",
        ("procrastinate", "worker"),
        "procrastinate_jobs",
        "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
    ),
    Peer(
        "django-tasks-db",
        ("db_worker",),
        "django_tasks_database_dbtaskresult",
        "SELECT count(*) FROM django_tasks_database_dbtaskresult "
        "WHERE status IN ('READY', 'RUNNING')",
    ),
    Peer("django-q2", ("qcluster",), "django_q_ormq", "SELECT count(*) FROM django_q_ormq", True),
    _oban(10),  # the limit oban-py's documentation starts a queue with
    _oban(1),
)
OURS = "SELECT count(*) FROM work_items WHERE status IN ('pending', 'in_progress')"


def run(bench: Bench) -> dict[str, Any]:
    from bench.peers.venv import peers_python

    s = bench.sizes
    python = str(peers_python())
    db = f"{bench.db_name}_peers"
    url = with_database(bench.server_url, db)
    env = {k: v for k, v in subprocess_env(url).items() if k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="bench.peers.site.settings", BENCH_PEER_DATABASE_URL=url)
    results: dict[str, list[dict[str, Any]]] = {}
    recreate_database(bench.server_url, db)
    try:
        _django(python, env, "migrate", "-v0", what="migrating the peers' database")
        for peer in PEERS:
            results[peer.name] = []
            for n in s.peers_workers:
                _top_up(python, env, url, peer, s.peers_items)
                progress(f"  {peer.name} x{n}")
                spawn = _peer_spawn(bench, python, env, peer, n)
                count = 1 if peer.one_process else n
                got = window_drain(bench, url, peer.table, peer.remaining, count, spawn, n)
                results[peer.name].append({"peer": peer.name, **got})
    finally:
        drop_database(bench.server_url, db)
    ours = []
    for n in s.peers_workers:
        bench.reset()
        bench.enqueue_noop(s.peers_items)
        bench.sql("ANALYZE work_items")
        progress(f"  runworker x{n}")
        spawn = lambda i, n=n: bench.runworker(name=f"peers-ours-{n}-{i}")  # noqa: E731
        ours.append(window_drain(bench, bench.url, "work_items", OURS, n, spawn, n))
    return {
        "measures": (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        **_ratios(ours, results, s.peers_items),
    }


def _ratios(
    ours: list[dict[str, Any]], peers: dict[str, list[dict[str, Any]]], items: int
) -> dict[str, Any]:
    ours_at = {r["workers"]: r["jobs_per_s"] for r in ours}
    for runs in peers.values():
        for r in runs:
            mine = ours_at.get(r["workers"])
            r["ratio_ours_to_peer"] = (
                round(mine / r["jobs_per_s"], 1) if mine and r["jobs_per_s"] else None
            )
    at4 = [r for runs in peers.values() for r in runs if r["workers"] == 4 and r["jobs_per_s"]]
    best = max(at4, key=lambda r: r["jobs_per_s"], default=None)
    out: dict[str, Any] = {"items": items, "runworker": ours, "peers": peers}
    if best is not None and ours_at.get(4):
        ratio = round(ours_at[4] / best["jobs_per_s"], 1)
        out.update(best_peer_x4=best["peer"], ratio_to_best_peer_x4=ratio,
                   met=ratio >= TARGETS["peers_ratio_x4"])  # fmt: skip
    return out


def _django(python: str, env: dict[str, str], *args: str, what: str) -> str:
    return _python(python, env, "-m", "django", *args, what=what)


def _python(python: str, env: dict[str, str], *args: str, what: str) -> str:
    done = subprocess.run(
        [python, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise BenchError(f"{what} failed:\n{(done.stderr or done.stdout)[-2000:]}")
    return done.stdout


def _top_up(python: str, env: dict[str, str], url: str, peer: Peer, items: int) -> None:
    """Enqueue what it takes for `items` jobs to wait, through the peer's own API."""
    with connect(url) as conn:
        installed = (
            peer.oban_limit is None
            or conn.execute("SELECT to_regclass('oban_jobs') IS NOT NULL").fetchone()[0]
        )
        waiting = conn.execute(peer.remaining).fetchone()[0] if installed else 0
    if waiting < items and peer.oban_limit is not None:
        # Installs oban-py's schema into the peers' database on first use.
        _python(python, env, "-m", "bench.peers.oban.enqueue", url, str(items - waiting),
                what=f"enqueueing {peer.name} jobs")  # fmt: skip
    elif waiting < items:
        _django(python, env, "bench_enqueue", peer.name, str(items - waiting),
                what=f"enqueueing {peer.name} jobs")  # fmt: skip
    with connect(url) as conn:
        conn.execute(f"ANALYZE {peer.table}")


def _peer_spawn(
    bench: Bench, python: str, env: dict[str, str], peer: Peer, n: int
) -> Callable[[int], subprocess.Popen[bytes]]:
    if peer.oban_limit is not None:
        command = [python, *peer.worker, "--dsn", env["BENCH_PEER_DATABASE_URL"]]
    else:
        command = [python, "-m", "django", *peer.worker]

    def spawn(i: int) -> subprocess.Popen[bytes]:
        return bench.procs.spawn(
            command,
            env={**env, "BENCH_PEER_WORKERS": str(n)},
            name=f"peer-{peer.name}-{n}-{i}",
        )[0]

    return spawn


def window_drain(
    bench: Bench,
    url: str,
    table: str,
    remaining_sql: str,
    processes: int,
    spawn: Callable[[int], subprocess.Popen[bytes]],
    workers: int,
) -> dict[str, Any]:
    """Jobs finished per second from the gate's release until none is left or W seconds."""
    window = bench.sizes.peers_window_s
    with connect(url) as conn:

        def sample() -> tuple[float, int]:
            at, left = conn.execute(
                f"SELECT extract(epoch FROM clock_timestamp()), ({remaining_sql})"
            ).fetchone()
            return float(at), int(left)

        start: dict[str, tuple[float, int]] = {}
        procs = gate_and_start(
            bench, processes, "worker", spawn, lambda _: start.setdefault("s", sample()),
            url=url, table=table,
        )  # fmt: skip
        try:
            t0, left0 = start["s"]
            t, left = t0, left0
            while left > 0 and t - t0 < window:
                time.sleep(_next_sample_in(t - t0, left0 - left, left))
                t, left = sample()
                if any(p.poll() not in (None, 0) for p in procs):
                    raise BenchError(f"a worker exited early; logs in {bench.log_dir}")
        finally:
            for proc in procs:
                bench.procs.stop(proc, grace_s=15)
    done = left0 - left
    return {
        "workers": workers,
        "processes": processes,
        "waiting_at_start": left0,
        "finished": done,
        "seconds": round(t - t0, 2),
        "jobs_per_s": round(done / (t - t0), 1) if t > t0 else None,
    }


# Seconds between two counts of what is left, and between two near the end.
SAMPLE_S = 0.1
FINAL_SAMPLE_S = 0.005


def _next_sample_in(elapsed: float, done: int, left: int) -> float:
    """Counts every 0.1 s, then every 5 ms once the drain is about to end.

    A drain that ends inside the window is timed to the first count that
    finds nothing left, up to one interval after its last job: a short
    drain's rate cannot afford 0.1 s of that, a 4 s window's can.
    """
    if done and left * elapsed / done < 2 * SAMPLE_S:
        return FINAL_SAMPLE_S
    return SAMPLE_S


def rows(r: dict[str, Any]) -> Iterator[Row]:
    yield Row(
        f"runworker jobs/s, {r['items']:,} waiting, x"
        + "/".join(str(x["workers"]) for x in r["runworker"]),
        " / ".join(f"{x['jobs_per_s']:,}" for x in r["runworker"]),
    )
    for name, runs in r["peers"].items():
        yield Row(
            f"  {name} jobs/s (our ratio)",
            " / ".join(f"{x['jobs_per_s']:,} ({x['ratio_ours_to_peer']}x)" for x in runs),
        )
    if "ratio_to_best_peer_x4" in r:
        yield Row(
            f"runworker x4 / best peer x4 ({r['best_peer_x4']})",
            r["ratio_to_best_peer_x4"],
            f">= {TARGETS['peers_ratio_x4']:g}",
            r["met"],
        )
