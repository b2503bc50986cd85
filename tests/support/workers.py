"""Real `runworker` processes for the gate tests (pauses, concurrency limits), PostgreSQL,
and reading the summary line `runworker` ends with."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import IO, Any

from tests.support.helpers import ROOT

# Idle workers of a test look for new items this often (LEASING["POLL_INTERVAL"]).
FAST_POLL = {"POLL_INTERVAL": 0.05}

SUMMARY_LINE = re.compile(
    r"^worker (?P<worker_id>.+) stopped \((?P<reason>[^)]*)\): (?P<counts>.+)$"
)


def leasing_env(**overrides: Any) -> dict[str, str]:
    """The environment that gives a test's subprocess these LEASING keys (tests/settings.py),
    idle polls of FAST_POLL unless they say otherwise."""
    return {"LEASING_TEST_SETTINGS": json.dumps({**FAST_POLL, **overrides})}


def parse_summary(output: str) -> dict[str, Any]:
    """The last `worker ID stopped (REASON): claimed N, completed N, ...` line, as a dict."""
    for line in reversed(output.splitlines()):
        if match := SUMMARY_LINE.match(line.strip()):
            counts = (pair.rsplit(" ", 1) for pair in match["counts"].split(", "))
            return {
                "worker_id": match["worker_id"],
                "reason": match["reason"],
                **{name: int(value) for name, value in counts},
            }
    raise AssertionError(f"no worker summary line in {output!r}")


def start_workers(
    count: int,
    subprocess_env: dict[str, str],
    log: IO[bytes],
    *,
    concurrency: int = 4,
    leasing: dict[str, Any] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start `count` workers; output to a file (a pipe nobody reads would block them)."""
    env = {**subprocess_env, "LEASING_LOG_LEVEL": "WARNING", **leasing_env(**(leasing or {}))}
    return [
        subprocess.Popen(
            [sys.executable, "manage.py", "runworker", "--concurrency", str(concurrency)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for _ in range(count)
    ]


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    for proc in workers:
        if proc.poll() is None:
            proc.terminate()
    for proc in workers:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
