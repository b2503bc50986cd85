"""The fault run's processes, kept running as a process manager would.

Each `Role` is one long-running `manage.py` command (a worker, a sweep, a
scheduler, the producer) started through the HA tests' `Fleet`. A thread
restarts whichever role's process has exited, after a short pause (as
systemd's `Restart=always` would), and records why it exited: killed by the
injector, or by itself (with the last line of its log). The stops at the end
(a retire, the final stop) are recorded too: once the faults are over, a
worker, sweep or scheduler must exit 0 on SIGTERM by itself, and one that
hangs or fails there is a finding, not a process to kill quietly. Such a
stop waits until the process has been up `START_GRACE_S`: one told to stop
while Python and Django are still starting it dies by SIGTERM's default
action before any code of the command runs, as any Python program would
(a scheduler restarted 0.8 s before the faults ended was told to stop 5.8 s
later, on a loaded host, and exited -15).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field

from leasing.worker.runtime import EXIT_ABANDONED_RUNS
from tests.ha.processes import Fleet, Proc

# How long a role stays down before it is started again.
RESTART_DELAY = 0.5
# How long a process is given to start before a stop of it is judged (see above).
START_GRACE_S = 15.0
# The product's commands, whose stops are judged (the producer is the test's own script).
JUDGED = ("worker", "sweep", "scheduler")


@dataclass
class Role:
    name: str
    kind: str  # worker, sweep, scheduler or producer
    args: tuple[str, ...]
    env: dict[str, str]
    restart: bool = True  # the producer is done when it exits 0
    proc: Proc | None = None
    starts: int = 0
    killed: bool = False  # the injector killed the current process
    retired: bool = False  # stopped for good (the settle phase)
    down_since: float | None = None
    launched_at: float = 0.0  # time.monotonic() of the current process's start


@dataclass(frozen=True)
class Exit:
    role: str
    kind: str
    code: int | None
    killed: bool
    last_line: str

    @property
    def crash(self) -> bool:
        """A worker, sweep or scheduler that ended by itself, other than as designed.

        The commands wait out the injected outages instead of exiting, so
        exit 0 (the producer's end) and a worker's 75 (too many abandoned
        runs: a restart by design) are the only exits a run expects.
        """
        if self.killed or self.kind not in JUDGED or self.code == 0:
            return False
        return not (self.kind == "worker" and self.code == EXIT_ABANDONED_RUNS)


@dataclass(frozen=True)
class Stop:
    """How a process ended when it was told to stop (SIGTERM) with no fault going on."""

    role: str
    kind: str
    code: int | None  # None: still running at the timeout, so it was killed

    @property
    def judged(self) -> bool:
        return self.kind in JUDGED

    @property
    def clean(self) -> bool:
        return not self.judged or self.code == 0

    def __str__(self) -> str:
        if self.code is None:
            return f"{self.role} did not exit on SIGTERM and was killed (its stacks are in its log)"
        return f"{self.role} exited {self.code} on SIGTERM"


@dataclass
class Supervisor:
    fleet: Fleet
    roles: list[Role]
    exits: list[Exit] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    start_grace: float = START_GRACE_S

    def start(self) -> None:
        for role in self.roles:
            self._launch(role)
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._thread.start()

    def _launch(self, role: Role) -> None:
        role.proc = self.fleet.start(role.name, *role.args, env=role.env)
        role.starts += 1
        role.launched_at = time.monotonic()
        role.killed = False
        role.down_since = None

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                for role in self.roles:
                    self._tend(role)

    def _tend(self, role: Role) -> None:
        proc = role.proc
        if proc is None or proc.alive() or role.retired:
            return
        now = time.monotonic()
        if role.down_since is None:
            role.down_since = now
            code = proc.popen.returncode
            lines = proc.output().strip().splitlines()
            last = lines[-1] if lines else ""
            self.exits.append(Exit(role.name, role.kind, code, role.killed, last))
            if not role.restart and code == 0:
                role.retired = True
                return
        if now - role.down_since >= RESTART_DELAY:
            self._launch(role)

    def alive(self, kind: str) -> list[Role]:
        with self._lock:
            return [
                r
                for r in self.roles
                if r.kind == kind and not r.retired and r.proc is not None and r.proc.alive()
            ]

    def kill(self, role: Role, *, env: dict[str, str] | None = None) -> None:
        """SIGKILL the role's process (it is restarted, with `env` changes if given)."""
        with self._lock:
            if env:
                role.env = {**role.env, **env}
            role.killed = True
            assert role.proc is not None
            role.proc.signal(signal.SIGKILL)

    def retire(self, kind: str, timeout: float = 30) -> None:
        """Stop every role of a kind for good (SIGTERM, as on a deploy)."""
        with self._lock:
            roles = [r for r in self.roles if r.kind == kind]
            for role in roles:
                role.retired = True
        self._stop_roles(roles, timeout)

    def stop(self, timeout: float = 45) -> None:
        """Stop restarting, then stop every process (SIGTERM, SIGKILL after `timeout`).

        The default is past SHUTDOWN_TIMEOUT (30 s): a worker still running an
        item at the end may use all of it, then hand the item back.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for role in self.roles:
                role.retired = True
        self._stop_roles(self.roles, timeout)
        self.fleet.stop_all(timeout=timeout)  # anything else the fleet started

    def _stop_roles(self, roles: list[Role], timeout: float) -> None:
        starting = [r.launched_at for r in roles if r.proc is not None and r.proc.alive()]
        if starting:
            time.sleep(max(0.0, max(starting) + self.start_grace - time.monotonic()))
        running = [r for r in roles if r.proc is not None and r.proc.alive()]
        codes = self.fleet.stop_many([r.proc for r in running if r.proc], timeout=timeout)
        for role in running:
            assert role.proc is not None
            self.stops.append(Stop(role.name, role.kind, codes[role.proc.name]))

    def unclean_stops(self) -> list[Stop]:
        """Stops, after the faults, that ended by a kill or a non-zero exit."""
        return [s for s in self.stops if not s.clean]

    def unexpected_exits(self) -> list[Exit]:
        """Exits the injector did not cause (a producer's normal end aside)."""
        return [e for e in self.exits if not e.killed and e.code != 0]

    def crashes(self) -> list[Exit]:
        """Exits that fail the run (`Exit.crash`)."""
        return [e for e in self.exits if e.crash]
