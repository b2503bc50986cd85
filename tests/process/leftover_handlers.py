"""Handlers that leave something behind (a transaction, a process), for
tests/process/test_handler_leftovers.py; registered through LEASING['HANDLERS'] in the
worker it starts, in thread or process execution."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.db import transaction

from leasing import WorkContext


def open_atomic(ctx: WorkContext) -> Any:
    """Enters an atomic block it never exits, writes in it, and returns."""
    transaction.atomic().__enter__()
    ctx.checkpoint("iteration_end", {"in": "open transaction"})
    return {"left": "open"}


def open_atomic_raises(ctx: WorkContext) -> Any:
    """Raises inside an atomic block that is never exited."""
    transaction.atomic().__enter__()
    ctx.checkpoint("iteration_end", {"in": "open transaction"})
    raise RuntimeError("raised inside its own transaction")


def autocommit_off(ctx: WorkContext) -> Any:
    """Turns autocommit off, writes, and returns without committing."""
    transaction.set_autocommit(False)
    ctx.checkpoint("iteration_end", {"in": "open transaction"})
    return {"autocommit": False}


def checkpoints(ctx: WorkContext) -> Any:
    """A checkpoint locks the item's row: it waits forever inside a transaction left open."""
    ctx.checkpoint("iteration_end", {"i": 1})
    return {"ok": 1}


# A process that ignores SIGTERM: only SIGKILL ends it. It says when it is ready.
STUBBORN = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(300)"
)


def _start_processes(ctx: WorkContext) -> None:
    """Start `sleep 300` and a stubborn Python process; record their pids in ctx.input['pids']."""
    plain = subprocess.Popen(["sleep", "300"])
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout is not None
    stubborn.stdout.readline()  # its SIGTERM is ignored from here on
    Path(ctx.input["pids"]).write_text(f"{plain.pid} {stubborn.pid} {os.getpid()}\n")


def processes_then_hang(ctx: WorkContext) -> Any:
    """Starts processes, then blocks until its timeout stops it."""
    _start_processes(ctx)
    time.sleep(3600)
    return None


def processes_then_exit(ctx: WorkContext) -> Any:
    """Starts processes, then ends its child without a word."""
    _start_processes(ctx)
    os._exit(7)
