"""Handlers the test suite runs, in-process and in worker subprocesses.

`LEASING_TEST_RECORD` (a file path) makes handlers append one line per
execution, so tests can count how often each item really ran, across
processes.
"""

from __future__ import annotations

import os
import time
from typing import Any

from leasing import WorkContext, handler
from leasing.exceptions import PermanentError


def record(ctx: WorkContext, what: str = "ran") -> None:
    path = os.environ.get("LEASING_TEST_RECORD")
    if path:
        # O_APPEND writes of one short line are atomic across processes.
        with open(path, "a") as f:
            f.write(f"{ctx.lease.work_item_id} {ctx.lease.token} {what} {ctx.worker_id}\n")


@handler("test.noop")
def noop(ctx: WorkContext) -> None:
    record(ctx)
    return None


@handler("test.after_dependencies")
def after_dependencies(ctx: WorkContext) -> Any:
    """Reports how many of its item's dependencies had not completed when it ran (0)."""
    from leasing.models import WorkItem

    record(ctx)
    unfinished = (
        WorkItem.objects.filter(dependent_links__dependent_id=ctx.lease.work_item_id)
        .exclude(status="completed")
        .count()
    )
    return {"unfinished_dependencies": unfinished}


@handler("test.echo")
def echo(ctx: WorkContext) -> Any:
    record(ctx)
    return {"echo": ctx.input, "attempt": ctx.attempt}


@handler("test.fail_then_succeed")
def fail_then_succeed(ctx: WorkContext) -> Any:
    record(ctx)
    if ctx.attempt <= (ctx.input or {}).get("failures", 1):
        raise RuntimeError(f"planned failure {ctx.attempt}")
    return {"attempt": ctx.attempt}


@handler("test.always_fail")
def always_fail(ctx: WorkContext) -> Any:
    record(ctx)
    raise ValueError("this always fails")


@handler("test.permanent")
def permanent(ctx: WorkContext) -> Any:
    record(ctx)
    raise PermanentError("bad input, do not retry")


@handler("test.bad_output")
def bad_output(ctx: WorkContext) -> Any:
    return {"not json": object()}


@handler("test.sleep")
def sleep(ctx: WorkContext) -> Any:
    """Thread mode: sleeps without beating; the renewer keeps the lease."""
    record(ctx, "start")
    time.sleep(float((ctx.input or {}).get("seconds", 0.5)))
    record(ctx)
    return {"slept": True, "lease_lost": ctx.lease_lost}


@handler("test.beat_sleep", heartbeat="beat")
def beat_sleep(ctx: WorkContext) -> Any:
    """Beat mode: beats every `every` seconds for `seconds`; `every` 0 means never."""
    data = ctx.input or {}
    seconds, every = float(data.get("seconds", 1)), float(data.get("every", 0.1))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(every or 0.05)
        if every:
            ctx.beat()
    record(ctx)
    return {"lease_lost": ctx.lease_lost}


@handler("test.resumable")
def resumable(ctx: WorkContext) -> Any:
    """Counts to `n`, checkpointing each step; crashes once at `crash_at`."""
    data = ctx.input or {}
    state = ctx.resume_state() or {"i": 0}
    for i in range(state["i"], data.get("n", 5)):
        if i == data.get("crash_at") and ctx.attempt == 1:
            raise RuntimeError("crash mid-way")
        state = {"i": i + 1}
        ctx.checkpoint("iteration_end", state)
    return {"resumed_at": ctx.resume_state(), "attempt": ctx.attempt}


# --- the edges: superseded runs, BaseExceptions, time-outs, bad rows, lost connections ---


@handler("test.sleep_token")
def sleep_token(ctx: WorkContext) -> Any:
    """Sleeps `seconds` (`later` from the second claim on) and returns its run's token."""
    data = ctx.input or {}
    record(ctx, "start")
    seconds = data.get("seconds", 1) if ctx.lease.token == 1 else data.get("later", 1)
    time.sleep(float(seconds))
    record(ctx, "end")
    return {"token": ctx.lease.token}


@handler("test.slow_first_attempt", heartbeat="beat")
def slow_first_attempt(ctx: WorkContext) -> Any:
    """Attempt 1 never beats (its lease runs out); later attempts beat while they work."""
    data = ctx.input or {}
    record(ctx, "start")
    if ctx.attempt == 1:
        time.sleep(float(data.get("first", 4)))
    else:
        deadline = time.monotonic() + float(data.get("later", 3))
        while time.monotonic() < deadline:
            time.sleep(0.1)
            ctx.beat()
    record(ctx, "end")
    return {"token": ctx.lease.token}


@handler("test.base_exception", max_retries=0)
def base_exception(ctx: WorkContext) -> Any:
    """Raises the BaseException its input names, as handler code can."""
    record(ctx)
    kind = (ctx.input or {}).get("raise")
    if kind == "exit":
        exit(3)
    if kind == "SystemExit":
        raise SystemExit(4)
    if kind == "KeyboardInterrupt":
        raise KeyboardInterrupt
    if kind == "GeneratorExit":
        raise GeneratorExit
    return {"ok": True}


@handler("test.stuck", timeout=2, max_retries=0)
def stuck(ctx: WorkContext) -> Any:
    """Ignores everything for up to `seconds`; records when it learns its lease is lost."""
    deadline = time.monotonic() + float((ctx.input or {}).get("seconds", 20))
    noticed = False
    while time.monotonic() < deadline:
        if ctx.lease_lost and not noticed:
            record(ctx, "lease_lost")
            noticed = True
        time.sleep(0.05)
    return {"finished": True}


@handler("test.surrogate_output")
def surrogate_output(ctx: WorkContext) -> Any:
    return {"s": "bad \ud800 text"}


@handler("test.db_query")
def db_query(ctx: WorkContext) -> Any:
    """Uses the executor's database connection, as most handlers do."""
    from leasing.models import WorkItem

    record(ctx)
    return {"found": WorkItem.objects.filter(pk=ctx.lease.work_item_id).exists()}


@handler("test.kill_own_connection")
def kill_own_connection(ctx: WorkContext) -> Any:
    """PostgreSQL: the server drops this handler's connection in the middle of its work."""
    from django.db import connection

    record(ctx)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    with connection.cursor() as cursor:  # the connection is gone: OperationalError
        cursor.execute("SELECT 1")
    return {"unreachable": True}


@handler("test.locked_once")
def locked_once(ctx: WorkContext) -> Any:
    """The first attempt meets a lock timeout (what SQLite reports when its busy wait runs out)."""
    import sqlite3

    from django.db import OperationalError

    record(ctx)
    if ctx.lease.interruptions == 0:
        # What Django raises when SQLite's busy wait runs out.
        raise OperationalError("database is locked") from sqlite3.OperationalError(
            "database is locked"
        )
    return {"interruptions_before": ctx.lease.interruptions}


# --- the example of docs/how-to/testing.md (tests/db/test_example_user_handlers.py) ---------


@handler("example.send_welcome", max_retries=2)
def send_welcome(ctx: WorkContext) -> Any:
    """Mails a new user once, however often the item runs; fails while the address is bad."""
    from django.core import mail

    email = ctx.input["email"]
    if "@" not in email:
        raise PermanentError(f"not an address: {email!r}")
    ctx.run_once(
        f"welcome:{email}",
        {"email": email},
        lambda: mail.send_mail("Welcome", "Glad you are here.", None, [email]),
    )
    ctx.checkpoint("iteration_end", {"mailed": email})
    return {"mailed": email}


@handler("test.until_cancelled")
def until_cancelled(ctx: WorkContext) -> Any:
    """Works (beating) until it is asked to stop, then checkpoints, which raises Cancelled."""
    record(ctx, "start")
    deadline = time.monotonic() + float((ctx.input or {}).get("seconds", 10))
    while time.monotonic() < deadline:
        ctx.beat()
        if ctx.cancelled:
            record(ctx, "cancelled")
            ctx.checkpoint("manual_checkpoint", {"stopping": True})  # raises Cancelled
        time.sleep(0.05)
    return {"ran_out": True}


@handler("test.traced", max_retries=1)
def traced(ctx: WorkContext) -> Any:
    """Two checkpoints and a run_once; fails its first attempt when asked (`fail_first`)."""
    data = ctx.input or {}
    ctx.checkpoint("iteration_start", {"step": 0})
    sent = ctx.run_once(f"notify-{ctx.lease.work_item_id}", {"to": "ops"}, lambda: {"sent": 1})
    ctx.checkpoint("iteration_end", {"step": 1})
    if data.get("fail_first") and ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return {"sent": sent, "attempt": ctx.attempt}


@handler("test.pid")
def pid(ctx: WorkContext) -> Any:
    """Returns the pid of the process it ran in (no `execution` option: the worker's choice)."""
    return {"pid": os.getpid()}


# A worker serving a process-mode type starts a child process per executor, so the
# types of tests/process/test_process_mode.py are registered only in the workers of
# those tests (the variable reaches their children too).
if os.environ.get("LEASING_TEST_PROCESS_HANDLERS") == "1":
    from tests.testapp import process_handlers  # noqa: F401
