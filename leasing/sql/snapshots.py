"""The shape of an `error_boundary` checkpoint, written by the worker, the sweep and operators.

One field list, two builders: `error_boundary()` for Python callers and
`error_boundary_sql()` for the sweep, which builds its snapshots inside its
recovery statement. Readers (the Tasks backend, the console) read each fact
by one key:

    error                 the message also stored as the item's error_message
    reason                handler_error | lease_expired | timed_out | interrupted |
                          output_not_storable | operator | superseded (it would have been
                          retried, but another item holds its unique key: see `error`) |
                          cancelled (it was asked to stop)
    exception_class_path  dotted path of the exception class (worker failures)
    traceback             formatted traceback (worker failures)
    worker_id             the holder of the attempt that ended
    lease_token           that attempt's fencing token
    attempt               1 for the first run, 2 for the first retry, ...
    retry_count           retries used after this attempt
    max_retries           the item's budget
    will_retry            whether the item went back to pending
    new_status            pending | failed
    work_type             the item's work type
    lease_expires_at      the lease's expiry when it ended (ISO time)
    heartbeat_at          its last heartbeat (ISO time)
    lease_acquired_at     when that attempt's claim took the lease (ISO time): the start of
                          an attempt the sweep ended (a killed worker's), which has no elapsed_ms
    elapsed_ms            how long the handler ran (worker failures)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FIELDS = (
    "error",
    "reason",
    "exception_class_path",
    "traceback",
    "worker_id",
    "lease_token",
    "attempt",
    "retry_count",
    "max_retries",
    "will_retry",
    "new_status",
    "work_type",
    "lease_expires_at",
    "heartbeat_at",
    "elapsed_ms",
    "lease_acquired_at",
)

# Bounds of the text fields: the traceback belongs in the checkpoint, not the row.
MAX_ERROR_CHARS = 10_000
MAX_TRACEBACK_CHARS = 20_000


def error_boundary(**values: Any) -> dict[str, Any]:
    """The snapshot of an attempt that ended badly; unknown keys are refused."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise TypeError(f"unknown error_boundary field(s): {sorted(unknown)}")
    return {name: values.get(name) for name in FIELDS}


def error_boundary_sql(expressions: Mapping[str, str]) -> str:
    """PostgreSQL: `jsonb_build_object(...)` of the snapshot, from one SQL expression per field."""
    unknown = set(expressions) - set(FIELDS)
    if unknown:
        raise TypeError(f"unknown error_boundary field(s): {sorted(unknown)}")
    pairs = ", ".join(f"'{name}', {expressions.get(name, 'NULL')}" for name in FIELDS)
    return f"jsonb_build_object({pairs})"


def clean_text(text: str, limit: int) -> str:
    """Text any database column accepts: no NUL, no lone surrogate, at most `limit` characters."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text[:limit]
