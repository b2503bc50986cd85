"""Worker, sweep and helper processes of the HA tests (`manage.py` with tests.ha.settings).

    fleet = Fleet(run_dir, base_env)
    w = fleet.start("w1", "runworker", "--concurrency", "2", host=ns_host, env={...})
    fleet.stop_all()     # SIGTERM, then SIGKILL whatever is left

Each process gets its own session (process group) and log file in `run_dir`;
only processes this fleet started are ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .network import Host

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")
        return ""

    def signal(self, signum: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signum)

    def kill(self) -> None:
        """SIGKILL, after asking for every thread's stack in the log (tests.ha.settings)."""
        self.signal(signal.SIGUSR2)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=1.0)
        self.signal(signal.SIGKILL)


def base_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("HA_", "DATABASE_URL", "PYTEST_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="tests.ha.settings",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.update(extra)
    return env


class Fleet:
    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir = run_dir
        self.env = env
        self.procs: list[Proc] = []
        run_dir.mkdir(parents=True, exist_ok=True)

    def start(
        self,
        name: str,
        *args: str,
        host: Host | None = None,
        env: dict[str, str] | None = None,
    ) -> Proc:
        cmd = self.command(*args)
        if host is not None:
            cmd = host.command(*cmd)
        log = self.run_dir / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env={**self.env, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def command(self, *args: str) -> list[str]:
        """What `start` runs for these arguments: `manage.py` with them."""
        return [sys.executable, str(ROOT / "manage.py"), *args]

    def manage(self, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
        """Run a manage.py command to completion; return its stdout or raise with its output."""
        proc = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"manage.py {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n"
                f"{proc.stderr[-6000:]}"
            )
        return proc.stdout

    def stop(self, proc: Proc, timeout: float = 20) -> int | None:
        """SIGTERM, then wait; its exit code, or None if it had to be killed."""
        return self.stop_many([proc], timeout)[proc.name]

    def stop_many(self, procs: list[Proc], timeout: float = 30) -> dict[str, int | None]:
        """SIGTERM them all at once, then wait; their exit codes by name."""
        for proc in procs:
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes: dict[str, int | None] = {}
        for proc in procs:
            try:
                codes[proc.name] = proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.popen.wait(timeout=10)
                codes[proc.name] = None  # had to be killed
        return codes

    def stop_all(self, timeout: float = 20) -> None:
        self.stop_many(self.procs, timeout)

    def kill_all(self) -> None:
        for proc in self.procs:
            proc.signal(signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)

    def tails(self, lines: int = 15) -> str:
        """The last lines of every log, for a failure message."""
        parts = []
        for proc in self.procs:
            # A killed process's log ends with its threads' stacks (`Proc.kill`).
            killed = proc.popen.returncode == -signal.SIGKILL
            text = proc.output().splitlines()[-(lines * 5 if killed else lines) :]
            status = "running" if proc.alive() else f"exited {proc.popen.returncode}"
            parts.append(f"--- {proc.name} ({status}) ---\n" + "\n".join(text))
        return "\n".join(parts)
