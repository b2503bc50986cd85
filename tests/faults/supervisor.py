"""The fault run's processes, kept running as a process manager would.

Each `Role` is one long-running `manage.py` command (a worker, a sweep, a
scheduler, the producer) started through the HA tests' `Fleet`. A thread
restarts whichever role's process has exited, after a short pause (as
systemd's `Restart=always` would), and records why it exited: killed by the
injector, or by itself (with the last line of its log).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field

from tests.ha.processes import Fleet, Proc

# How long a role stays down before it is started again.
RESTART_DELAY = 0.5


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


@dataclass(frozen=True)
class Exit:
    role: str
    code: int | None
    killed: bool
    last_line: str


@dataclass
class Supervisor:
    fleet: Fleet
    roles: list[Role]
    exits: list[Exit] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        for role in self.roles:
            self._launch(role)
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._thread.start()

    def _launch(self, role: Role) -> None:
        role.proc = self.fleet.start(role.name, *role.args, env=role.env)
        role.starts += 1
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
            self.exits.append(Exit(role.name, code, role.killed, lines[-1] if lines else ""))
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
        procs = [r.proc for r in roles if r.proc is not None and r.proc.alive()]
        self.fleet.stop_many(procs, timeout=timeout)

    def stop(self) -> None:
        """Stop restarting, then stop every process (SIGTERM, SIGKILL after a while)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for role in self.roles:
                role.retired = True
        self.fleet.stop_all(timeout=30)

    def unexpected_exits(self) -> list[Exit]:
        """Exits the injector did not cause (a producer's normal end aside)."""
        return [e for e in self.exits if not e.killed and e.code != 0]
