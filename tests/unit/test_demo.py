"""`manage.py demo`: its children are restarted when they exit, and an expired lease stays
visible until the delayed recovery sweep starts.

The supervisor is tested with small real processes; the whole demo runs once
on its own SQLite file (in the SQLite pass: it never touches the test database).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import pytest

from project.demo.management.commands.demo import demo_children
from project.demo.supervisor import Child, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def until(predicate: Callable[[], object], timeout: float = 15.0, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(step)


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


def test_a_killed_child_is_restarted_and_the_demo_says_so(supervise):
    worker = Child("worker", SLEEPER)
    other = Child("dashboard", SLEEPER)
    supervisor, said = supervise(worker, other)
    supervisor.start()
    first = worker.proc.pid
    assert said == [
        f"   started the worker (pid {first})",
        f"   started the dashboard (pid {other.proc.pid})",
    ]

    os.kill(first, signal.SIGKILL)
    until(lambda: (supervisor.check(), worker.restarts == 1)[1])
    assert f"   the worker (pid {first}) was killed by SIGKILL; restarting it in 0.05 s" in said
    assert said[-1] == f"   restarted the worker (pid {worker.proc.pid}, restart 1)"
    assert worker.proc.pid != first and worker.running
    assert other.running and other.restarts == 0  # the others were left alone

    supervisor.stop()
    assert not worker.running and not other.running


def test_a_worker_past_its_abandoned_run_bound_is_restarted_and_the_demo_says_why(supervise):
    """runworker exits 75 past LEASING["MAX_ABANDONED_RUNS"]: the supervisor starts a new one."""
    from leasing.worker.runtime import EXIT_ABANDONED_RUNS

    code = f"import time; time.sleep(0.3); raise SystemExit({EXIT_ABANDONED_RUNS})"
    worker = Child("worker", [sys.executable, "-c", code])
    supervisor, said = supervise(worker)
    supervisor.start()
    first = worker.proc.pid
    until(lambda: (supervisor.check(), worker.restarts == 1)[1])
    assert (
        f"   the worker (pid {first}) exited with code 75 (too many abandoned runs: a fresh "
        "process frees their threads); restarting it in 0.05 s"
    ) in said
    assert worker.proc.pid != first


def test_a_delayed_child_starts_after_its_delay(supervise):
    late = Child("recovery sweep", SLEEPER, start_after=0.5)
    supervisor, said = supervise(late)
    started = time.monotonic()
    supervisor.start()
    assert late.proc is None and supervisor.alive
    assert said == ["   the recovery sweep starts in 0.5 s"]
    supervisor.check()
    assert late.proc is None
    until(lambda: (supervisor.check(), late.running)[1])
    assert time.monotonic() - started >= 0.5
    assert said[-1] == f"   started the recovery sweep (pid {late.proc.pid})"


def test_the_demo_starts_its_sweep_late():
    children = {child.name: child for child in demo_children(8123, 60)}
    assert set(children) == {"dashboard", "worker", "recovery sweep"}
    assert children["recovery sweep"].start_after == 60
    assert "recoverysweep" in children["recovery sweep"].argv
    assert children["dashboard"].start_after == children["worker"].start_after == 0
    assert "127.0.0.1:8123" in children["dashboard"].argv
    assert demo_children(8123, 0)[-1].start_after == 0


# --- the whole demo -------------------------------------------------------------------------


def test_run_restarts_a_lone_child_and_stops_it_on_sigterm(supervise):
    """`run()` keeps going when its only child dies, and stops everything on SIGTERM."""
    lone = Child("worker", SLEEPER)
    supervisor, said = supervise(lone)
    pids: list[int] = []
    before = signal.getsignal(signal.SIGTERM)

    def operator() -> None:
        until(lambda: lone.running)
        pids.append(lone.proc.pid)
        os.kill(pids[0], signal.SIGKILL)
        until(lambda: lone.restarts == 1 and lone.running)
        pids.append(lone.proc.pid)
        os.kill(os.getpid(), signal.SIGTERM)  # to the demo (here: this process)

    helper = threading.Thread(target=operator)
    helper.start()
    supervisor.run(interval=0.05)  # returns on the SIGTERM
    helper.join(timeout=10)
    assert len(pids) == 2 and pids[0] != pids[1]
    assert not lone.running
    assert lone.proc.returncode == -signal.SIGTERM  # stopped with one SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before  # the handler was put back
