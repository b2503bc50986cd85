"""Real `runworker` processes for the gate tests (pauses, concurrency limits), PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import IO, Any

from tests.conftest import ROOT


def start_workers(
    count: int,
    subprocess_env: dict[str, str],
    log: IO[bytes],
    *,
    concurrency: int = 4,
    leasing: dict[str, Any] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start `count` workers; output to a file (a pipe nobody reads would block them)."""
    env = {**subprocess_env, "LEASING_LOG_LEVEL": "WARNING"}
    if leasing:
        env["LEASING_TEST_SETTINGS"] = json.dumps(leasing)
    return [
        subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runworker",
                "--poll-interval",
                "0.05",
                "--concurrency",
                str(concurrency),
            ],
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
