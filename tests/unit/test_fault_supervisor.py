"""The fault run's supervisor judges how the product's processes stop after the faults.

Real processes (small Python scripts standing in for the commands): one that
exits 0 on SIGTERM, one that exits 3, one that ignores SIGTERM. The run must
fail on the last two, which before were killed and forgotten.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from tests.faults.supervisor import Role, Supervisor
from tests.ha.processes import Fleet

BEHAVIOURS = {
    # Each prints "ready" once its SIGTERM handler is in place.
    "obeys": "import signal,sys,time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nprint('ready', flush=True)\n"
    "while True: time.sleep(0.05)",
    "fails": "import signal,sys,time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\nprint('ready', flush=True)\n"
    "while True: time.sleep(0.05)",
    "crashes": "print('ready', flush=True)\nraise SystemExit(1)",
    "restarts": "print('ready', flush=True)\nraise SystemExit(75)",  # too many abandoned runs
    # Its handler comes a second after it starts, as a command's after Django's start-up.
    "starts_slowly": "import signal,sys,time\ntime.sleep(1)\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nprint('ready', flush=True)\n"
    "while True: time.sleep(0.05)",
    "hangs": "import signal,time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
    "while True: time.sleep(0.05)",
}


class ScriptFleet(Fleet):
    """Runs `python -c BEHAVIOURS[args[0]]` in place of `manage.py args`."""

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-c", BEHAVIOURS[args[0]]]


def _started(supervisor: Supervisor) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if all(r.proc and "ready" in r.proc.output() for r in supervisor.roles):
            return
        time.sleep(0.02)
    raise AssertionError("the stand-in processes did not start")


def _supervisor(tmp_path: Path, *layout: tuple[str, str, str]) -> Supervisor:
    roles = [Role(name, kind, (behaviour,), {}) for name, kind, behaviour in layout]
    # The stand-ins are ready when they say so (`_started`): no start-up to wait out.
    supervisor = Supervisor(ScriptFleet(tmp_path, {}), roles, start_grace=0.0)
    supervisor.start()
    _started(supervisor)
    return supervisor


def test_a_process_told_to_stop_while_it_starts_is_given_its_start_up_first(
    tmp_path: Path,
) -> None:
    def stop_at_once(grace: float) -> int | None:
        roles = [Role("scheduler", "scheduler", ("starts_slowly",), {})]
        supervisor = Supervisor(ScriptFleet(tmp_path / str(grace), {}), roles, start_grace=grace)
        supervisor.start()
        supervisor.stop(timeout=5)
        return supervisor.stops[0].code

    # Without the grace, SIGTERM's default action ends it before its handler is in place.
    assert stop_at_once(0.0) == -signal.SIGTERM
    assert stop_at_once(3.0) == 0


def test_a_clean_stop_is_recorded_as_clean(tmp_path: Path) -> None:
    supervisor = _supervisor(tmp_path, ("worker-1", "worker", "obeys"), ("sweep", "sweep", "obeys"))
    supervisor.stop(timeout=5)
    assert [(s.role, s.code) for s in supervisor.stops] == [("worker-1", 0), ("sweep", 0)]
    assert supervisor.unclean_stops() == []


def test_a_process_that_hangs_or_fails_on_sigterm_is_unclean(tmp_path: Path) -> None:
    supervisor = _supervisor(
        tmp_path,
        ("scheduler", "scheduler", "fails"),
        ("worker-1", "worker", "hangs"),
        ("worker-2", "worker", "obeys"),
    )
    supervisor.retire("scheduler", timeout=5)
    supervisor.stop(timeout=1)
    unclean = {s.role: str(s) for s in supervisor.unclean_stops()}
    assert unclean == {
        "scheduler": "scheduler exited 3 on SIGTERM",
        "worker-1": "worker-1 did not exit on SIGTERM and was killed (its stacks are in its log)",
    }
    hung = next(r for r in supervisor.roles if r.name == "worker-1")
    assert hung.proc is not None
    assert hung.proc.popen.returncode in (-signal.SIGUSR2, -signal.SIGKILL)
    # A retired role is not started again, and the final stop records each process once.
    assert [r.starts for r in supervisor.roles] == [1, 1, 1]
    assert len(supervisor.stops) == 3


def test_the_producer_is_not_judged(tmp_path: Path) -> None:
    supervisor = _supervisor(tmp_path, ("producer", "producer", "fails"))
    supervisor.stop(timeout=5)
    assert [s.code for s in supervisor.stops] == [3]
    assert supervisor.unclean_stops() == []


def test_a_worker_that_exits_by_itself_is_a_crash(tmp_path: Path) -> None:
    supervisor = _supervisor(
        tmp_path,
        ("worker-1", "worker", "crashes"),
        ("worker-2", "worker", "restarts"),
        ("producer", "producer", "crashes"),
    )
    deadline = time.monotonic() + 20
    while len({e.role for e in supervisor.exits}) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    supervisor.stop(timeout=5)
    crashes = {e.role for e in supervisor.crashes()}
    assert crashes == {"worker-1"}  # 75 is a restart by design; the producer is not judged
    assert {e.role for e in supervisor.unexpected_exits()} == {"worker-1", "worker-2", "producer"}
