"""Signal receivers that append what a process was told to a file of its own.

Each process writes `<FAULTS_RECORDS>/<FAULTS_PROC>-<pid>.jsonl`, one JSON line
per signal, in one `write()` on a file opened with O_APPEND: a line is either
whole or (cut by SIGKILL) unreadable and skipped, and no database fault can
lose one. Signals are sent after the change committed, so a process killed
between its commit and this write leaves no record of it: the checker reads
records against the database's journal, never the other way round.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from leasing import signals

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_lock = threading.Lock()
_fd: int | None = None


def microseconds(moment: datetime | None) -> int | None:
    """An aware datetime as integer microseconds since the epoch (exact)."""
    if moment is None:
        return None
    return (moment - EPOCH) // timedelta(microseconds=1)


def _file() -> int:
    global _fd
    with _lock:
        if _fd is None:
            directory = Path(os.environ["FAULTS_RECORDS"])
            name = f"{os.environ.get('FAULTS_PROC', 'proc')}-{os.getpid()}.jsonl"
            _fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return _fd


def write(kind: str, work_item_id: str, token: int, worker_id: str | None, **fields: Any) -> None:
    line = {
        "kind": kind,
        "item": work_item_id,
        "token": token,
        "worker": worker_id,
        "proc": os.environ.get("FAULTS_PROC", ""),
        **fields,
    }
    os.write(_file(), (json.dumps(line) + "\n").encode())


def on_acquired(sender: Any, lease: Any, **kwargs: Any) -> None:
    write(
        "claim",
        lease.work_item_id,
        lease.token,
        lease.worker_id,
        expires=microseconds(lease.expires_at),
        deadline=microseconds(lease.deadline_at),
    )


def on_renewed(
    sender: Any, work_item_id: str, token: int, worker_id: str, expires_at: Any, **kwargs: Any
) -> None:
    write("renew", work_item_id, token, worker_id, expires=microseconds(expires_at))


def on_released(
    sender: Any, work_item_id: str, token: int, worker_id: str, status: str, **kwargs: Any
) -> None:
    write("release", work_item_id, token, worker_id, status=status)


def on_expired(
    sender: Any,
    work_item_id: str,
    token: int,
    worker_id: str,
    status: str,
    timed_out: bool,
    **kwargs: Any,
) -> None:
    write("expire", work_item_id, token, worker_id, status=status, timed_out=timed_out)


def connect() -> None:
    """Record every claim, renewal, release and expiry this process makes."""
    receivers = (
        (signals.lease_acquired, on_acquired),
        (signals.lease_renewed, on_renewed),
        (signals.lease_released, on_released),
        (signals.lease_expired, on_expired),
    )
    for signal, receiver in receivers:
        signal.connect(receiver, dispatch_uid=f"faults.{receiver.__name__}")
