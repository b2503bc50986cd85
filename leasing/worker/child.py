"""The child process's side of process execution: run handlers sent by the worker.

A child is a fresh interpreter (`multiprocessing`'s "spawn"), so it sets
Django up itself, opens its own database connection, and runs each handler
with an ordinary `WorkContext` on the lease (item and token) the worker
claimed: its checkpoints, `run_once` calls and any other write are fenced
by that token exactly as in a thread. The worker keeps the lease alive
(its renewer); the child forwards the handler's proof-of-work beats, which
the renewer turns into fenced extensions, as it does for a thread.

Messages, parent to child: `("run", work_type, dotted_path, lease, received)`
(received: the worker's receipt of the lease, wall-clock ns, where the claim span ends),
`("cancel", key)` (the item was asked to stop), and None to exit. Child to
parent: `("ready", pid)` once, then per run any number of `("beat",)`, when tracing
is on `("span", trace_id, span_id, flags)` (its run span), and
one `("done", output_json, rss)` or `("error", kind, exception, text, rss)`.

SIGTERM raises `SystemExit` in the handler (so its `finally` blocks run)
and the child exits without answering; the worker has already written the
run's ending. The child leads its own process group (a session), which the
worker signals as a whole, so processes the handler started stop with it;
outside that group, Ctrl-C at a terminal reaches only the worker, which
decides. If the worker dies, the child exits too: the pipe closes, and on
Linux a parent-death signal ends it even while the handler blocks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

# Forwarded beats at most this often: the renewer needs one beat per renewal,
# and a handler beating in a tight loop must not flood the pipe.
BEAT_FORWARD_SECONDS = 0.1


class RemoteTraceback(Exception):
    """The handler's traceback in the child, attached as the cause of what it raised."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def resident_bytes() -> int:
    """This process's resident memory now (Linux), or its peak elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this process when the worker that started it dies, whatever it runs."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it died before the signal was asked for
        os._exit(1)


# Set by SIGTERM: the SystemExit in flight is the worker's stop, not the handler's own.
_TERMINATING = threading.Event()
# The exit status of a child ended by SIGTERM (128 + 15, as a shell reports it): the
# worker tells a SIGTERM it did not send (a service manager signalling the whole
# group) from a crash by it.
TERMINATED_EXIT_CODE = 143


def _on_sigterm(_signum: int, _frame: object) -> None:
    _TERMINATING.set()
    raise SystemExit(0)


class _Runs:
    """The run in progress (its context, by lease key), shared with the reader thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.key: tuple[str, int] | None = None
        self.context: Any = None


def main(conn: Connection, database: dict[str, Any], using: str, parent_pid: int) -> None:
    """The child's whole life: set up, then run what the worker sends until told to exit."""
    # Its own session, so its own process group: the worker stops the whole group, and
    # with the child whatever the handler started (a subprocess it waits on, say).
    with contextlib.suppress(OSError):
        os.setsid()
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the worker; it decides
    import django

    django.setup()
    from django.db import connections

    # The worker's own database settings (a test database, an embedding
    # program's overrides), not only what the settings module says.
    connections[using].settings_dict.update(database)
    jobs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
    runs = _Runs()
    reader = threading.Thread(target=_read, args=(conn, jobs, runs), name="reader", daemon=True)
    reader.start()
    from ..sql.runner import IDLE_CHECK_SECONDS, HangUpWatch, refresh_connection

    hang_up, last_run = HangUpWatch(), time.monotonic()
    conn.send(("ready", os.getpid()))
    try:
        while (job := jobs.get()) is not None:
            _, work_type, dotted_path, lease, received = job
            # A connection that broke in an earlier run, or while it sat idle or
            # a handler held it without using it, is replaced before this run uses it.
            idle = time.monotonic() - last_run > IDLE_CHECK_SECONDS
            refresh_connection(connections[using], hang_up, idle)
            conn.send(_run(conn, runs, work_type, dotted_path, lease, received, using))
            last_run = time.monotonic()
    except SystemExit:
        if _TERMINATING.is_set():
            # Stopped by the worker: the handler's `finally` blocks have run; skip the
            # interpreter's own clean-up, which the worker would otherwise wait for.
            os._exit(TERMINATED_EXIT_CODE)
        raise


def _read(conn: Connection, jobs: queue.SimpleQueue[tuple[Any, ...] | None], runs: _Runs) -> None:
    """Pass runs to the main thread, and a request to stop to the run it is for (a lost
    lease needs no message: the worker stops the child)."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(1)  # the worker is gone: nobody will record what this run does
        if message is None or message[0] == "run":
            jobs.put(message)
            continue
        with runs.lock:
            context = runs.context if runs.key == message[1] else None
        if context is not None:  # else it is for a run that already ended
            context.request_cancel()


def end_handler_transactions(lease: Any) -> list[str]:
    """After a handler (in a thread or a child): roll back any transaction it left open on
    its thread's connections, logged; returns their aliases."""
    from ..sql.runner import end_left_transactions

    left = end_left_transactions()
    if left:
        logging.getLogger("leasing.worker").warning(
            "the handler of %s (token %d) left a transaction open on database %s; "
            "it was rolled back",
            lease.work_item_id,
            lease.token,
            ", ".join(repr(alias) for alias in left),
        )
    return left


def _run(
    conn: Connection,
    runs: _Runs,
    work_type: str,
    dotted_path: str,
    lease: Any,
    received: int,
    using: str,
) -> tuple[Any, ...]:
    from django.utils.module_loading import import_string

    from .. import tracing, validation
    from ..context import WorkContext
    from ..handlers import registry
    from ..heartbeat import Heartbeat
    from ..sql.runner import TransactionLeftOpen
    from .outcomes import classify

    last_forwarded = [0.0]

    def forward_beat() -> None:
        now = time.monotonic()
        if now - last_forwarded[0] >= BEAT_FORWARD_SECONDS:
            last_forwarded[0] = now
            conn.send(("beat",))

    context = WorkContext(lease, Heartbeat(on_beat=forward_beat), using=using)
    with runs.lock:
        runs.key, runs.context = lease.key, context
    try:
        func = registry.get(work_type).func if work_type in registry else import_string(dotted_path)
        # The run span is made here, around the handler, so the spans of its checkpoints
        # and run_once calls (made in this process) nest under it.
        try:
            output = tracing.run_in_child(
                lambda: func(context), lease, received, lambda ids: conn.send(("span", *ids))
            )
        finally:
            # Before the answer: the worker writes the outcome on rows this transaction
            # may hold locked, and the next run must not join it.
            left_open = end_handler_transactions(lease)
        if left_open:
            raise TransactionLeftOpen.on(left_open)
        return ("done", validation.payload("handler output", output), resident_bytes())
    except Exception as exc:
        return ("error", classify(exc), *_portable(exc), resident_bytes())
    except BaseException as exc:  # SystemExit from SIGTERM ends the child, unanswered
        if _TERMINATING.is_set():
            raise
        return ("error", classify(exc), *_portable(exc), resident_bytes())
    finally:
        with runs.lock:
            runs.key = runs.context = None


def _portable(exc: BaseException) -> tuple[bytes | None, str]:
    """The exception pickled if it survives the trip, and its traceback as text.

    Pickling keeps an exception's class, arguments and attributes, not its
    traceback or chain: the worker attaches the text as its cause.
    """
    text = "".join(traceback.format_exception(exc))
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)  # some exceptions pickle but cannot be rebuilt
        return data, text
    except Exception:
        return None, text
