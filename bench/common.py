"""What the benchmark scripts share: database URLs, subprocesses, statistics, output.

Nothing here imports Django, so the plain-psycopg ceiling loop (bench.ceiling)
can use it without paying for Django's start-up.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
DEFAULT_SERVER_URL = "postgres://postgres@127.0.0.1:5432/test"
BENCH_SETTINGS = "bench.settings"
JSON_PREFIX = ""  # JSON lines are plain JSON objects: every stdout line starting with "{"


# --- database URLs and connections ------------------------------------------------------


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name` on the same server."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise SystemExit(f"the benchmarks need PostgreSQL; --database-url is {url!r}")
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def libpq_url(url: str) -> str:
    """psycopg accepts postgres:// and postgresql:// but not pgsql://."""
    parts = urlsplit(url)
    return urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, parts.fragment))


def connect(url: str, *, autocommit: bool = True, timeout_s: float = 10.0) -> Any:
    import psycopg

    return psycopg.connect(libpq_url(url), autocommit=autocommit, connect_timeout=int(timeout_s))


def admin_connect(server_url: str) -> Any:
    """A connection to the server's maintenance database, for CREATE/DROP DATABASE."""
    import psycopg

    last: Exception | None = None
    for name in ("postgres", "template1"):
        try:
            return connect(with_database(server_url, name))
        except psycopg.OperationalError as exc:
            last = exc
    raise SystemExit(f"cannot connect to PostgreSQL at {server_url!r}: {last}")


def _ident(name: str) -> str:
    if not name.replace("_", "").isalnum() or not name[0].isalpha():
        raise SystemExit(f"database name must be letters, digits and _, got {name!r}")
    return '"' + name + '"'


def recreate_database(server_url: str, name: str) -> None:
    with admin_connect(server_url) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {_ident(name)} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {_ident(name)}")


def drop_database(server_url: str, name: str) -> None:
    with admin_connect(server_url) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {_ident(name)} WITH (FORCE)")


# --- subprocesses --------------------------------------------------------------------------


class Processes:
    """Every subprocess a benchmark starts, so that none outlives it.

    Children run in their own session (a terminal's Ctrl-C reaches only the
    benchmark, which then stops them) with output in log files, never pipes,
    so a chatty child cannot block. `cleanup()` runs at exit and on
    SIGTERM/SIGINT: SIGTERM, a grace period, then SIGKILL, each by pid.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self._lock = threading.Lock()
        self._counter = 0

    def spawn(
        self, args: Sequence[str], *, env: dict[str, str], name: str
    ) -> tuple[subprocess.Popen[bytes], Path]:
        with self._lock:
            self._counter += 1
            log = self.log_dir / f"{self._counter:03d}-{name}.log"
        handle = open(log, "wb")  # noqa: SIM115 - the child owns it; closed below
        try:
            proc = subprocess.Popen(
                list(args),
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            handle.close()
        with self._lock:
            self._procs.append((proc, log))
        return proc, log

    def wait_all(
        self, procs: Iterable[subprocess.Popen[bytes]], timeout_s: float, what: str
    ) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            remaining = deadline - time.monotonic()
            try:
                proc.wait(timeout=max(remaining, 0.01))
            except subprocess.TimeoutExpired:
                raise BenchError(
                    f"{what}: pid {proc.pid} still running after {timeout_s:g}s"
                ) from None

    def stop(self, proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace_s`; returns the exit code."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout=10)
        return proc.returncode

    def cleanup(self, grace_s: float = 5.0) -> None:
        with self._lock:
            procs = [p for p, _ in self._procs if p.poll() is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)

    def log_tail(self, proc: subprocess.Popen[bytes], lines: int = 15) -> str:
        for p, log in self._procs:
            if p is proc:
                try:
                    text = log.read_text(errors="replace").splitlines()
                except OSError:
                    return ""
                return "\n".join(text[-lines:])
        return ""


class BenchError(RuntimeError):
    """A scenario could not produce a trustworthy figure."""


def make_log_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="leasing-bench-"))


def install_cleanup(cleanup: Callable[[], None]) -> None:
    """Run `cleanup` at exit and on SIGTERM/SIGINT (then exit 130/143; a second signal
    ends the run at once).

    The clean-up runs on the signal thread, not in the handler: it takes
    locks (the subprocesses' list, logging) that the main thread may hold
    when the signal lands.
    """
    from leasing.threads import SignalThread

    lock = threading.Lock()
    done = False

    def once() -> None:
        nonlocal done
        with lock:  # held throughout, so an exit waits for a clean-up under way
            if not done:
                done = True
                cleanup()

    def on_signal(signum: int) -> None:
        sys.stderr.write(f"\n{signal.Signals(signum).name}: stopping subprocesses...\n")
        once()
        os._exit(128 + signum)

    atexit.register(once)
    SignalThread(on_signal, second_is_default=True).install()


def subprocess_env(database_url: str, **extra: str) -> dict[str, str]:
    """The environment of a bench subprocess: the project's default logging (INFO)
    unless `extra` sets LEASING_LOG_LEVEL, as a user who sets nothing gets it."""
    env = dict(os.environ)
    env.pop("LEASING_LOG_LEVEL", None)
    env.update(
        DATABASE_URL=database_url,
        DJANGO_SETTINGS_MODULE=BENCH_SETTINGS,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
    )
    env.update(extra)
    return env


def wait_for(
    predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.02
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(interval_s)


# --- statistics ------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return float(ordered[lo])
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo))


def summary_ms(values: Sequence[float], digits: int = 2) -> dict[str, Any]:
    """p50/p90/p99/max/mean of a list of milliseconds."""
    if not values:
        return {"n": 0}

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    return {
        "n": len(values),
        "p50": r(percentile(values, 50)),
        "p90": r(percentile(values, 90)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values)),
        "mean": r(sum(values) / len(values)),
    }


# --- output ------------------------------------------------------------------------------------


def emit(record: dict[str, Any]) -> None:
    """One machine-readable line per scenario on stdout."""
    sys.stdout.write(JSON_PREFIX + json.dumps(record, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def progress(message: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


@contextlib.contextmanager
def stopwatch() -> Iterator[dict[str, float]]:
    box: dict[str, float] = {}
    start = time.perf_counter()
    try:
        yield box
    finally:
        box["seconds"] = time.perf_counter() - start
