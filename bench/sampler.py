"""A background sampler: database connections and memory of bench subprocesses over time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import connect
from leasing.sql.wakes import LISTENING


def rss_mib(pid: int) -> float | None:
    """Resident memory of a live process, in MiB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError):
        return None
    return None


class Sampler:
    """Samples, every `interval_s` on its own thread and connection, until stopped:

    * per application_name (each bench subprocess gets its own through PGAPPNAME):
      the most backends it had at once, and how many of them were LISTENing;
    * per pid: the largest resident memory;
    * whatever `probe(conn)` returns, with the database clock, into `series`.
    """

    def __init__(
        self,
        url: str,
        pids: dict[str, int],
        interval_s: float = 0.25,
        probe: Callable[[Any], Any] | None = None,
    ) -> None:
        self.url = url
        self.pids = pids
        self.interval_s = interval_s
        self.probe = probe
        self.connections: dict[str, int] = {}
        self.listeners: dict[str, int] = {}
        self.rss: dict[str, float] = {}
        self.series: list[tuple[float, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            with connect(self.url) as conn:
                while not self._stop.is_set():
                    self._sample(conn)
                    self._stop.wait(self.interval_s)
        except BaseException as exc:  # reported by the scenario, never lost in a thread
            self.error = exc

    def _sample(self, conn: Any) -> None:
        got = conn.execute(
            f"SELECT application_name, count(*), count(*) FILTER (WHERE {LISTENING}) "
            "FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = ANY(%s) GROUP BY 1",
            [list(self.pids)],
        ).fetchall()
        for name, count, listening in got:
            self.connections[name] = max(self.connections.get(name, 0), count)
            self.listeners[name] = max(self.listeners.get(name, 0), listening)
        for name, pid in self.pids.items():
            rss = rss_mib(pid)
            if rss is not None:
                self.rss[name] = max(self.rss.get(name, 0.0), rss)
        if self.probe is not None:
            at = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]
            self.series.append((float(at), self.probe(conn)))
