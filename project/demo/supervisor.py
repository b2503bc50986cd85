"""The demo's child processes: started (some after a delay), restarted when they exit.

`manage.py demo` runs the dashboard, a worker and the recovery sweep as child
processes. A child that exits on its own (killed, crashed) is started again
after `RESTART_DELAY` seconds and the demo says so; one that keeps exiting
right after it starts (a port in use, a broken setting) is given up on after
`MAX_QUICK_EXITS` tries, with a line saying why. A child with `start_after`
starts that many seconds after the others (the sweep, so that an expired
lease stays on the dashboard for a while).

Whatever ends the supervisor, its children end too: Ctrl-C, SIGTERM and
SIGHUP (the terminal closed) stop them one by one; if the supervisor is
killed or crashes, Linux sends each child SIGTERM as its parent dies (a
parent-death signal, set in the child before it runs), so no worker or
dashboard is left holding the port.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

RESTART_DELAY = 1.0
QUICK_EXIT_SECONDS = 10.0
MAX_QUICK_EXITS = 3
STOP_TIMEOUT = 35.0  # above the worker's default 30 s shutdown timeout


@dataclass
class Child:
    """One child process of the demo, and what happened to it so far."""

    name: str
    argv: Sequence[str]
    start_after: float = 0.0
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    due_at: float = 0.0  # when to (re)start it; 0: not waiting
    restarts: int = 0
    quick_exits: int = 0
    given_up: bool = False
    history: list[int] = field(default_factory=list)  # pids, oldest first

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


# What a worker's exit status means (docs/how-to/systemd.md, "Exit statuses of runworker").
EXIT_MEANINGS = {75: "too many abandoned runs: a fresh process frees their threads"}


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    meaning = EXIT_MEANINGS.get(code)
    return f"exited with code {code}" + (f" ({meaning})" if meaning else "")


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# prctl(2) option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGTERM when `parent` dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was set
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Supervisor:
    """Start the children, restart those that exit, stop them all at the end."""

    def __init__(
        self,
        children: Sequence[Child],
        say: Callable[[str], None],
        *,
        env: dict[str, str] | None = None,
        restart_delay: float = RESTART_DELAY,
        stop_timeout: float = STOP_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = list(children)
        self.say = say
        self.env = env
        self.restart_delay = restart_delay
        self.stop_timeout = stop_timeout
        self.clock = clock
        self.stopping = False

    def start(self) -> None:
        now = self.clock()
        for child in self.children:
            if child.start_after > 0:
                child.due_at = now + child.start_after
                self.say(f"   the {child.name} starts in {child.start_after:g} s")
            else:
                self._spawn(child)
                assert child.proc is not None
                self.say(f"   started the {child.name} (pid {child.proc.pid})")

    def _spawn(self, child: Child) -> None:
        # Its own process group: Ctrl-C in the terminal reaches the demo only,
        # which then sends each child one SIGTERM (a second signal would make
        # the worker exit at once instead of finishing its items).
        # And it dies with the demo, however the demo ends (`_die_with`).
        child.proc = subprocess.Popen(
            list(child.argv), env=self.env, process_group=0, preexec_fn=_die_with(os.getpid())
        )
        child.started_at = self.clock()
        child.due_at = 0.0
        child.history.append(child.proc.pid)

    def check(self) -> None:
        """Start what is due; schedule a restart of each child that exited."""
        now = self.clock()
        for child in self.children:
            if child.given_up or self.stopping:
                continue
            if child.proc is None or child.proc.poll() is not None:
                if child.due_at and now >= child.due_at:
                    again = child.proc is not None
                    self._spawn(child)
                    if again:
                        child.restarts += 1
                        self.say(
                            f"   restarted the {child.name} (pid {child.proc.pid}, "
                            f"restart {child.restarts})"
                        )
                    else:
                        self.say(f"   started the {child.name} (pid {child.proc.pid})")
                elif child.proc is not None and not child.due_at:
                    self._exited(child, now)

    def _exited(self, child: Child, now: float) -> None:
        assert child.proc is not None
        how = describe_exit(child.proc.returncode)
        quick = now - child.started_at < QUICK_EXIT_SECONDS
        child.quick_exits = child.quick_exits + 1 if quick else 0
        if child.quick_exits >= MAX_QUICK_EXITS:
            child.given_up = True
            self.say(
                f"   the {child.name} (pid {child.proc.pid}) {how}, {child.quick_exits} times "
                "in a row right after starting: not restarting it (see its output above)"
            )
            return
        child.due_at = now + self.restart_delay
        self.say(
            f"   the {child.name} (pid {child.proc.pid}) {how}; restarting it "
            f"in {self.restart_delay:g} s"
        )

    @property
    def alive(self) -> bool:
        """True while some child is not given up (it runs, or will be (re)started)."""
        return any(not c.given_up for c in self.children)

    def run(self, interval: float = 0.5) -> None:
        """Supervise until every child is given up, or Ctrl-C / SIGTERM / SIGHUP (then stop them).

        Both signals are handled here, SIGINT too: a process started in the
        background by a non-interactive shell (`make demo &`, a CI script)
        inherits SIGINT ignored, and Python then never turns it into
        KeyboardInterrupt, so Ctrl-C / `kill -INT` would stop nothing.
        """
        previous = {signum: signal.signal(signum, _interrupt) for signum in STOP_SIGNALS}
        self.start()
        try:
            while self.alive and not self.stopping:
                time.sleep(interval)
                self.check()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def stop(self) -> None:
        """SIGTERM every running child; kill, and name, any still running `stop_timeout` later.

        One deadline for all of them, so Ctrl-C ends the demo within
        `stop_timeout` however many children are slow to stop.
        """
        self.stopping = True
        running = [c for c in self.children if c.running]
        for child in running:
            assert child.proc is not None
            child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for child in running:
            assert child.proc is not None
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(
                    f"   the {child.name} (pid {child.proc.pid}) did not stop within "
                    f"{self.stop_timeout:g} s of SIGTERM; killing it"
                )
                child.proc.kill()
                child.proc.wait()
