"""Plain helpers of the test tiers: the database a subprocess should use, waiting,
reading a row, threads started together."""

from __future__ import annotations

import contextlib
import copy
import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.db import connection, connections

ROOT = Path(__file__).resolve().parent.parent.parent


def run_in_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Run target(i) in `count` threads started together; return results or raise.

    Each thread closes its own database connection when it ends so the test
    database can be dropped afterwards.
    """
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def runner(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = target(index)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=runner, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


def raise_deadlock() -> None:
    """Raise what Django raises when PostgreSQL aborts a statement to break a deadlock."""
    import psycopg
    from django.db import OperationalError

    try:
        raise psycopg.errors.DeadlockDetected("deadlock detected")
    except psycopg.Error as cause:
        raise OperationalError("deadlock detected") from cause


def database_url() -> str:
    """A DATABASE_URL for the test database, for subprocesses."""
    s = connections["default"].settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    user = quote(s.get("USER") or "")
    password = s.get("PASSWORD") or ""
    auth = f"{user}:{quote(password)}@" if password else (f"{user}@" if user else "")
    host = s.get("HOST") or "127.0.0.1"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{s['NAME']}"


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02) -> float:
    """Wait until predicate() is true; return the seconds it took (AssertionError on timeout)."""
    import time

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def row(item_id: str) -> dict[str, Any]:
    """The work item's row as a dict, read now."""
    from leasing.models import WorkItem

    return WorkItem.objects.filter(pk=item_id).values().get()


def recorded(path: Path, what: str | None = None) -> list[list[str]]:
    """Lines a test handler recorded (`item token what worker`), optionally of one kind."""
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if what is None or line[2] == what]


def pipe_lines(stream: Any) -> queue.Queue[str]:
    """Read a pipe in a thread so the test can wait for a line with a timeout."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def site_settings(tmp_path: Path, body: str) -> dict[str, str]:
    """A settings module in tmp_path on top of the test settings; env to use it."""
    (tmp_path / "site_settings.py").write_text("from tests.settings import *  # noqa\n" + body)
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "site_settings"
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def database_now() -> Any:
    """The database clock, as Leasing reads it (every lease time is on this clock)."""
    from leasing.sql.runner import database_now as now

    return now()


def process_running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (ended, not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@contextlib.contextmanager
def mirror_alias(alias: str, blocker: Any) -> Iterator[None]:
    """A database alias for the duration: a second session on the test database (a test
    mirror of `default`, as a streaming replica of it). `blocker`: pytest-django's
    `django_db_blocker`, to close the alias's session at the end.

    Added to the connection handler before pytest-django checks the aliases a test
    asks for: call it from a module-scoped fixture.
    """
    settings_dict = copy.deepcopy(connections["default"].settings_dict)
    settings_dict["TEST"] = {**settings_dict.get("TEST", {}), "MIRROR": "default"}
    connections.settings[alias] = settings_dict
    try:
        yield
    finally:
        with blocker.unblock():
            connections[alias].close()
        del connections[alias]
        del connections.settings[alias]


def e013() -> list[str]:
    """The messages of check leasing.E013 (a leasing Tasks backend's OPTIONS) now."""
    from django.core.checks import run_checks

    return [m.msg for m in run_checks() if m.id == "leasing.E013"]
