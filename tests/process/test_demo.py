"""`manage.py demo`: its children are restarted when they exit, and an expired lease stays
visible until the delayed recovery sweep starts.

The supervisor is tested with small real processes; the whole demo runs once
on its own SQLite file (in the SQLite pass: it never touches the test database).
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from project.demo.supervisor import MAX_QUICK_EXITS, Child, Supervisor
from tests.support.helpers import ROOT

pytestmark = pytest.mark.long

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def until(predicate: Callable[[], object], timeout: float = 15.0, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(step)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture
def supervise():
    made: list[Supervisor] = []

    def make(*children: Child, delay: float = 0.05) -> tuple[Supervisor, list[str]]:
        said: list[str] = []
        supervisor = Supervisor(children, said.append, restart_delay=delay)
        made.append(supervisor)
        return supervisor, said

    yield make
    for supervisor in made:
        supervisor.stop()


def test_a_child_that_keeps_exiting_at_once_is_given_up(supervise):
    broken = Child("dashboard", [sys.executable, "-c", "raise SystemExit(3)"])
    steady = Child("worker", SLEEPER)
    supervisor, said = supervise(broken, steady)
    supervisor.start()
    until(lambda: (supervisor.check(), broken.given_up)[1])
    assert broken.restarts == MAX_QUICK_EXITS - 1
    assert said[-1].endswith(
        f"exited with code 3, {MAX_QUICK_EXITS} times in a row right after starting: "
        "not restarting it (see its output above)"
    )
    assert steady.running and supervisor.alive
    steady.proc.kill()
    steady.proc.wait()
    steady.given_up = True
    assert not supervisor.alive


# --- the whole demo -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def expired_leases(path: Path) -> list[str]:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT task_id FROM work_items WHERE status = 'in_progress' AND lease_expires_at < ?",
            (now,),
        ).fetchall()
    return [task for (task,) in rows]


def test_the_demo_keeps_an_expired_lease_visible_and_restarts_a_killed_worker(tmp_path, vendor):
    if vendor != "sqlite":
        pytest.skip("the demo runs on its own SQLite file; the SQLite pass covers it")
    db = tmp_path / "demo.sqlite3"
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{db}",
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "PYTHONUNBUFFERED": "1",
    }
    expired_for = 10.0
    # Started with SIGINT ignored, as a non-interactive shell starts a background
    # job (`make demo &`, a CI script): Ctrl-C must stop the demo all the same.
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--port", str(free_port()),
         "--expired-for", str(expired_for)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_ignore_sigint,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()

    def said(text: str) -> str | None:
        return next((line for line in list(lines) if text in line), None)

    try:
        until(lambda: said("Ctrl-C stops everything") or proc.poll() is not None, timeout=90)
        assert proc.poll() is None, "".join(lines)
        serving = time.monotonic()
        assert expired_leases(db), "the demo data set has no expired lease"
        announced = said("expired lease awaiting the sweep:")
        assert announced and "demo-" in announced, "".join(lines)
        # The supervisor prints its children's lines after that one, once it has
        # spawned the dashboard and the worker (the sweep is the last child).
        until(lambda: said(f"the recovery sweep starts in {expired_for:g} s"), timeout=20)
        worker_line = said("started the worker (pid ")
        assert worker_line, "".join(lines)
        worker_pid = int(worker_line.split("pid ")[1].rstrip(")\n"))

        # The worker is killed: the demo says so and starts another.
        os.kill(worker_pid, signal.SIGKILL)
        until(lambda: said("restarted the worker (pid "), timeout=20)
        assert said(f"the worker (pid {worker_pid}) was killed by SIGKILL; restarting it")
        restarted = said("restarted the worker (pid ")
        new_pid = int(restarted.split("pid ")[1].split(",")[0])
        assert new_pid != worker_pid

        # A while later the expired lease is still there (no sweep runs yet); once the
        # sweep starts, its first pass recovers it.
        time.sleep(max(0.0, serving + 5.5 - time.monotonic()))
        assert not said("started the recovery sweep")
        assert expired_leases(db)
        until(lambda: said("started the recovery sweep"), timeout=expired_for + 20)
        until(lambda: not expired_leases(db), timeout=20)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the demo did not stop within 60 s of Ctrl-C:\n" + "".join(lines))
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, "".join(lines)
    # Every child stopped on its SIGTERM; none had to be killed.
    assert not said("did not stop within"), "".join(lines)
    reader.join(timeout=5)
    # Every child was stopped with the demo.
    for pid in (new_pid,):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_stop_kills_and_names_children_that_ignore_sigterm_within_one_deadline(tmp_path):
    """Two children that ignore SIGTERM: both killed and named, after one stop timeout in all."""
    ready = [tmp_path / "a", tmp_path / "b"]
    stubborn = [
        Child(
            name,
            [
                sys.executable,
                "-c",
                "import signal, sys, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "pathlib.Path(sys.argv[1]).touch(); time.sleep(60)",
                str(path),
            ],
        )
        for name, path in zip(("worker", "sweep"), ready, strict=True)
    ]
    said: list[str] = []
    supervisor = Supervisor(stubborn, said.append, stop_timeout=1.0)
    supervisor.start()
    try:
        until(lambda: all(path.exists() for path in ready))
        started = time.monotonic()
        supervisor.stop()
        took = time.monotonic() - started
    finally:
        for child in stubborn:
            if child.running:
                child.proc.kill()
    assert 1.0 <= took < 1.9, took  # one deadline, not one per child
    assert all(child.proc.returncode == -signal.SIGKILL for child in stubborn)
    for child in stubborn:
        line = f"the {child.name} (pid {child.proc.pid}) did not stop within 1 s of SIGTERM"
        assert any(line in s for s in said), said


@pytest.mark.parametrize("how", ["SIGKILL", "SIGHUP"])
def test_no_child_outlives_its_supervisor(tmp_path, how):
    """Killed (parent-death signal) or hung up on (closing the terminal): the children end."""
    script = tmp_path / "supervise.py"
    pids = tmp_path / "pids"
    script.write_text(
        "import sys, threading, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from project.demo.supervisor import Child, Supervisor\n"
        f"sleeper = {SLEEPER!r}\n"
        "children = [Child('a', sleeper), Child('b', sleeper)]\n"
        "supervisor = Supervisor(children, print, stop_timeout=5)\n"
        "def report():\n"
        "    while not all(c.running for c in children):\n"
        "        time.sleep(0.02)\n"
        f"    open({str(pids)!r}, 'w').write(' '.join(str(c.proc.pid) for c in children))\n"
        "threading.Thread(target=report, daemon=True).start()\n"
        "supervisor.run(interval=0.05)\n"
    )
    demo = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL)
    try:
        until(lambda: pids.exists() and len(pids.read_text().split()) == 2)
        children = [int(pid) for pid in pids.read_text().split()]
        demo.send_signal(getattr(signal, how))
        demo.wait(timeout=15)

        def gone(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            # A zombie (exited, not yet reaped by init) counts as gone.
            return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"

        until(lambda: all(gone(pid) for pid in children), timeout=10)
    finally:
        if demo.poll() is None:
            demo.kill()
