"""Why did it fail? An item's attempts and last error, and failures grouped by error.

Attempts are rebuilt from what the engine records: every claim adds one to
`lease_token`, and every attempt that did not complete left a checkpoint
naming its token: `error_boundary` from the worker (the handler raised; with
the traceback) or from the sweep (the lease expired), `state_transition` from
an operator (force-release, force-fail). The last attempt is read from the
row itself. Error texts and tracebacks live in checkpoint snapshots, so they
are returned only with `include_payloads=True`.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.utils.dateparse import parse_datetime

from ..models import Checkpoint, CheckpointType, WorkItem, WorkItemStatus
from .retrying import retrying

ATTEMPTS_SHOWN = 100
CHECKPOINTS_READ = 500


@dataclass(frozen=True, slots=True)
class Attempt:
    """One claim of the item (`token`), or an operator event between claims (`token` None)."""

    token: int | None
    worker: str | None
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str
    level: str  # "ok", "info", "warn" or "bad"
    error: str | None = None  # None unless payloads were requested
    sequence_number: int | None = None  # of the checkpoint that recorded it


@dataclass(frozen=True, slots=True)
class LastError:
    """The newest `error_boundary` checkpoint of the item."""

    error: str
    exception_type: str | None
    traceback: str | None
    at: datetime
    sequence_number: int
    cause: str  # what ended the attempt: "handler failed", "lease expired", ...


@dataclass(frozen=True, slots=True)
class ItemFailures:
    attempts: tuple[Attempt, ...]
    last_error: LastError | None  # None without payloads, or when nothing failed
    earlier_attempts_hidden: int


# What ended an attempt (the snapshot's `reason`), and what followed.
ENDINGS = {
    "handler_error": ("handler failed", "retry scheduled", "no retries left"),
    "lease_expired": ("lease expired", "re-queued by the sweep", "failed by the sweep"),
    "timed_out": ("timed out", "retry scheduled", "failed"),
    "interrupted": ("interrupted by the database", "re-queued, not counted as a retry", "failed"),
    "output_not_storable": ("output not storable", "retry scheduled", "failed"),
}


def _ended(snapshot: dict[str, Any], row: Mapping[str, Any], token: int) -> Attempt:
    """An attempt an `error_boundary` checkpoint records (snapshots before `reason` existed
    were the worker's handler errors)."""
    reason = snapshot.get("reason") or "handler_error"
    cause, retried, failed = ENDINGS.get(reason, ENDINGS["handler_error"])
    if snapshot.get("will_retry"):
        outcome, level = f"{cause}: {retried}", "warn"
    else:
        retries, budget = snapshot.get("retry_count"), snapshot.get("max_retries")
        permanent = (
            reason == "handler_error"
            and isinstance(retries, int)
            and isinstance(budget, int)
            and retries < budget
        )
        outcome = f"{cause}: {'permanent error, not retried' if permanent else failed}"
        level = "bad"
    elapsed = snapshot.get("elapsed_ms")
    started = None
    if isinstance(elapsed, int | float) and elapsed >= 0:
        started = row["created_at"] - timedelta(milliseconds=elapsed)
    elif isinstance(snapshot.get("lease_acquired_at"), str):
        # An attempt the sweep ended (its worker killed): the claim's time.
        started = parse_datetime(snapshot["lease_acquired_at"])
    worker = snapshot.get("worker_id") or snapshot.get("lease_holder")
    return Attempt(token, worker, started, row["created_at"], outcome, level)


def _operator_event(snapshot: dict[str, Any], row: Mapping[str, Any]) -> Attempt:
    action = str(snapshot.get("action", "operator action")).replace("_", "-")
    outcome = f"{action} by {snapshot.get('actor', '?')}: {snapshot.get('reason', '')}"
    claimed = snapshot.get("old_status") == WorkItemStatus.IN_PROGRESS
    token = snapshot.get("lease_token") if claimed else None
    worker = snapshot.get("lease_holder") if claimed else None
    return Attempt(token, worker, None, row["created_at"], outcome, "info")


def _recorded(row: Mapping[str, Any]) -> Attempt | None:
    """The attempt (or operator event) a checkpoint records."""
    snapshot = row["snapshot_data"] if isinstance(row["snapshot_data"], dict) else {}
    token = snapshot.get("lease_token")
    if row["checkpoint_type"] == CheckpointType.STATE_TRANSITION:
        attempt = _operator_event(snapshot, row)
    elif not isinstance(token, int):
        return None
    else:
        attempt = _ended(snapshot, row, token)
    return replace(
        attempt, error=_text(snapshot.get("error")), sequence_number=row["sequence_number"]
    )


def _current(item: WorkItem, token: int) -> Attempt:
    """The item's latest claim, read from its row."""
    status = item.status
    if status == WorkItemStatus.IN_PROGRESS:
        return Attempt(token, item.lease_holder, item.lease_acquired_at, None, "running", "info")
    if status == WorkItemStatus.COMPLETED:
        return Attempt(token, None, item.lease_acquired_at, item.completed_at, "completed", "ok")
    if status == WorkItemStatus.FAILED:
        return Attempt(token, None, item.lease_acquired_at, item.completed_at, "failed", "bad")
    return Attempt(
        token, None, item.lease_acquired_at, None, "handed back: no checkpoint recorded", "info"
    )


def item_failures(
    item: WorkItem, *, include_payloads: bool = False, using: str = "default"
) -> ItemFailures:
    """The attempts of `item`, oldest first, and its last error."""
    rows = list(
        Checkpoint.objects.using(using)
        .filter(
            work_item_id=item.pk,
            checkpoint_type__in=[CheckpointType.ERROR_BOUNDARY, CheckpointType.STATE_TRANSITION],
        )
        .order_by("-sequence_number")
        .values("checkpoint_type", "sequence_number", "created_at", "snapshot_data")[
            :CHECKPOINTS_READ
        ]
    )
    rows.reverse()
    by_token: dict[int, list[Attempt]] = defaultdict(list)
    events: list[Attempt] = []
    for row in rows:
        recorded = _recorded(row)
        if recorded is None:
            continue
        if recorded.token is None:
            events.append(recorded)
        else:
            by_token[recorded.token].append(recorded)
    first = max(1, item.lease_token - ATTEMPTS_SHOWN + 1)
    attempts: list[Attempt] = []
    for token in range(first, item.lease_token + 1):
        if by_token.get(token):
            attempts.extend(by_token[token])
        elif token == item.lease_token:
            attempts.append(_current(item, token))
        else:
            attempts.append(
                Attempt(token, None, None, None, "handed back: no checkpoint recorded", "info")
            )
    attempts = _with_events(attempts, events)
    if not include_payloads:
        attempts = [replace(a, error=None) for a in attempts]
    return ItemFailures(
        attempts=tuple(attempts),
        last_error=_last_error(rows) if include_payloads else None,
        earlier_attempts_hidden=first - 1,
    )


def _with_events(attempts: list[Attempt], events: list[Attempt]) -> list[Attempt]:
    """Operator events placed after the last attempt that ended before them."""
    merged = list(attempts)
    for event in events:
        assert event.ended_at is not None  # an operator event is dated by its checkpoint
        position = len(merged)
        for index, attempt in enumerate(merged):
            if attempt.ended_at is not None and attempt.ended_at > event.ended_at:
                position = index
                break
        merged.insert(position, event)
    return merged


def _last_error(rows: Sequence[Mapping[str, Any]]) -> LastError | None:
    for row in reversed(rows):
        snapshot = row["snapshot_data"] if isinstance(row["snapshot_data"], dict) else {}
        if row["checkpoint_type"] != CheckpointType.ERROR_BOUNDARY:
            continue
        error = _text(snapshot.get("error")) or "(no error text recorded)"
        cause = ENDINGS.get(snapshot.get("reason") or "", ENDINGS["handler_error"])[0]
        return LastError(
            error=error,
            exception_type=_text(snapshot.get("exception_class_path")) or exception_type(error),
            traceback=_text(snapshot.get("traceback")),
            at=row["created_at"],
            sequence_number=row["sequence_number"],
            cause=cause,
        )
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# --- failures grouped by error ---------------------------------------------------------------

# `ValueError: ...`, `requests.exceptions.ConnectionError: ...`: the type before the colon.
_TYPE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Timeout|Failure)"
                   r"|[A-Z][\w.]*): ")  # fmt: skip
_VARIABLE = (
    (re.compile(r"'[^']*'|\"[^\"]*\""), "'…'"),  # quoted values
    (re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b"), "<id>"),  # ULIDs
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}\b"), "<id>"),  # UUIDs
    (re.compile(r"\b0x[0-9a-fA-F]+\b|\b[0-9a-fA-F]{12,}\b"), "<hex>"),
    (re.compile(r"\d+(?:\.\d+)?"), "N"),
    (re.compile(r"\s+"), " "),
)
MESSAGE_LENGTH = 200


def exception_type(error: str) -> str | None:
    match = _TYPE.match(error)
    return match.group(1) if match else None


def normalise(error: str) -> tuple[str, str]:
    """`(exception type or "", message with its variable parts replaced)`."""
    kind = exception_type(error) or ""
    message = error[len(kind) + 2 :] if kind else error
    for pattern, replacement in _VARIABLE:
        message = pattern.sub(replacement, message)
    return kind, message.strip()[:MESSAGE_LENGTH]


def group_key(kind: str, message: str) -> str:
    return hashlib.sha256(f"{kind}\x1f{message}".encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ErrorGroup:
    """Items whose last error has one exception type and normalised message.

    `failed`: failed for good; `retrying`: failing but waiting for another
    attempt. `messages`: the group's distinct raw messages with their counts,
    most frequent first (error text: shown only with the payload permission).
    """

    key: str
    exception_type: str
    message: str
    count: int
    work_types: tuple[str, ...]
    first_at: datetime
    last_at: datetime
    examples: tuple[str, ...]  # work item ids, newest first
    failed: int = 0
    retrying: int = 0
    messages: tuple[tuple[str, int], ...] = ()


FAILED_ROWS_READ = 20_000
EXAMPLES_SHOWN = 3
MESSAGES_SHOWN = 5
RAW_MESSAGE_LENGTH = 500
NO_MESSAGE = "(no error message)"


def failed_in_window(start: datetime, *, using: str = "default") -> Any:
    """Items failed for good since `start` (through `work_items_finished_idx`)."""
    return (
        WorkItem.objects.using(using)
        .failed()
        .filter(completed_at__gte=start)
        .order_by("-completed_at", "-work_item_id")
    )


def retrying_in_window(start: datetime, *, using: str = "default") -> Any:
    """Items retrying whose last attempt failed since `start` (`console.retrying`)."""
    return (
        retrying(using=using).filter(updated_at__gte=start).order_by("-updated_at", "-work_item_id")
    )


def _window_rows(
    start: datetime, *, using: str, final_only: bool
) -> tuple[list[tuple[str, str, str | None, datetime, str]], bool]:
    """`(item id, work type, error, failed at, status)` of the window, newest first."""
    columns = ("work_item_id", "work_type", "error_message")
    failed = failed_in_window(start, using=using).values_list(*columns, "completed_at", "status")
    rows = list(failed[: FAILED_ROWS_READ + 1])
    if not final_only:
        pending = retrying_in_window(start, using=using).values_list(
            *columns, "updated_at", "status"
        )
        rows += list(pending[: FAILED_ROWS_READ + 1])
        rows.sort(key=lambda r: (r[3], r[0]), reverse=True)
    return rows[:FAILED_ROWS_READ], len(rows) > FAILED_ROWS_READ


def error_groups(
    start: datetime, *, using: str = "default", final_only: bool = False
) -> tuple[tuple[ErrorGroup, ...], bool]:
    """Items failed since `start` by exception type and normalised message, largest first.

    Items failed for good, and (unless `final_only`) items failing but still
    retrying. Reads at most `FAILED_ROWS_READ` items (the newest); the flag
    says whether there were more.
    """
    rows, truncated = _window_rows(start, using=using, final_only=final_only)
    grouped: dict[tuple[str, str], list[tuple[str, str, datetime, str, str]]] = defaultdict(list)
    # Failures repeat a few messages many times: each distinct one is normalised once.
    normalised: dict[str, tuple[str, str]] = {}
    for item_id, work_type, error, at, status in rows:
        raw = error or NO_MESSAGE
        group = normalised.get(raw)
        if group is None:
            group = normalised[raw] = normalise(raw)
        grouped[group].append((item_id, work_type, at, status, raw))
    groups = []
    for (kind, message), members in grouped.items():
        raw_counts = Counter(m[4][:RAW_MESSAGE_LENGTH] for m in members)
        groups.append(
            ErrorGroup(
                key=group_key(kind, message),
                exception_type=kind,
                message=message,
                count=len(members),
                work_types=tuple(sorted({m[1] for m in members})),
                first_at=min(m[2] for m in members),
                last_at=max(m[2] for m in members),
                examples=tuple(m[0] for m in members[:EXAMPLES_SHOWN]),
                failed=sum(1 for m in members if m[3] == WorkItemStatus.FAILED),
                retrying=sum(1 for m in members if m[3] != WorkItemStatus.FAILED),
                messages=tuple(raw_counts.most_common(MESSAGES_SHOWN)),
            )
        )
    groups.sort(key=lambda g: (-g.count, g.exception_type, g.message))
    return tuple(groups), truncated


def group_members(start: datetime, key: str, limit: int, *, using: str = "default") -> list[str]:
    """Ids of the items failed for good since `start` whose error falls in group `key`
    (at most `limit`): what retrying the group touches."""
    members = []
    rows = failed_in_window(start, using=using).values_list("work_item_id", "error_message")
    keys: dict[str, str] = {}  # a group key per distinct message, as in error_groups
    for item_id, error in rows[:FAILED_ROWS_READ]:
        raw = error or NO_MESSAGE
        if raw not in keys:
            keys[raw] = group_key(*normalise(raw))
        if keys[raw] == key:
            members.append(item_id)
            if len(members) >= limit:
                break
    return members
