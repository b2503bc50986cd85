"""Every error the leasing app raises.

`LeasingError` is the base of all of them. Bad input raises a
subclass of `InvalidInput`, which is also a `ValueError`; configuration errors
are `ImproperlyConfigured`; database failures are translated into
`DatabaseUnavailable` with the original error chained (`raise ... from`).
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class LeasingError(Exception):
    """Base class of every error raised by the leasing app."""


class LeasingConfigurationError(LeasingError, ImproperlyConfigured):
    """`settings.LEASING` (or a handler registration) is invalid."""


# --- bad input -------------------------------------------------------


class InvalidInput(LeasingError, ValueError):
    """An argument was rejected before any row was touched."""


class InvalidDuration(InvalidInput):
    """A lease duration, interval or timeout is not a positive finite number."""


class InvalidHeartbeatInterval(InvalidDuration):
    """The heartbeat interval is not below the lease duration."""


class InvalidStatus(InvalidInput):
    """A status name is not one of the statuses of the table."""


class InvalidCheckpointType(InvalidInput):
    """A checkpoint type is not one of the checkpoint types."""


class PayloadNotSerializable(InvalidInput, TypeError):
    """A payload cannot be stored as JSON."""


class PayloadTooLarge(InvalidInput):
    """A payload exceeds `LEASING["MAX_PAYLOAD_BYTES"]` once encoded as JSON."""


class InvalidIdempotencyKey(InvalidInput):
    """An idempotency key is empty, not a string, or longer than 255 characters."""


class UnknownWorkType(InvalidInput):
    """No handler is registered for a work type."""


class UnknownDependency(InvalidInput):
    """`depends_on` names a work item that does not exist."""


# --- lookups ----------------------------------------------------------------------


class WorkItemNotFound(LeasingError, LookupError):
    """No work item has the given id."""

    def __init__(self, work_item_id: str) -> None:
        super().__init__(f"No work item with id {work_item_id!r}.")
        self.work_item_id = work_item_id


# --- leases -------------------------------------------------------------------------


class LeaseError(LeasingError):
    """Base class of the lease errors."""


class LeaseExpiredError(LeaseError):
    """The lease ran out; a late heartbeat never brings it back."""


class LeaseConflictError(LeaseError):
    """Another worker holds the item, or its fencing token moved on."""


class LeaseLostError(LeaseExpiredError, LeaseConflictError):
    """The caller no longer holds the lease, so its write was refused.

    A subclass of both `LeaseExpiredError` and `LeaseConflictError` so that
    either except clause catches it.
    """


# --- handlers and operators ----------------------------------------------------------


class PermanentError(LeasingError):
    """Raised by a handler: fail the item now, do not retry."""


class Cancelled(PermanentError):
    """The item was asked to stop (`leasing.cancel()`): raised into its handler by
    `ctx.checkpoint()` and `ctx.run_once()`; the run then ends `cancelled`."""


class UnstorableOutput(PermanentError):
    """A run's result cannot be stored as JSON: the item fails at once.

    Running it again would repeat its side effects and fail the same way.
    The ending is recorded with `original`, the error that made the result
    unstorable (a `TypeError` for a `datetime`, a `set` or a model instance).
    """

    def __init__(self, message: str, original: BaseException) -> None:
        super().__init__(message)
        self.original = original


# --- processes -----------------------------------------------------------------------


class ProcessIdInUse(LeasingError):
    """A live process already uses this worker id."""


# --- checkpoints ---------------------------------------------------------------------


class CheckpointImmutable(LeasingError):
    """Checkpoints are append-only: they are never updated, and deleted only by retention."""


# --- idempotency ---------------------------------------------------------------------


class IdempotencyError(LeasingError):
    """Base class of the idempotency-key errors."""


class IdempotencyConflict(IdempotencyError):
    """The key was used before with a different request."""


class IdempotencyInProgress(IdempotencyError):
    """Another live run holds the key and has not finished yet."""


# --- infrastructure ------------------------------------------------------------------


class DatabaseUnavailable(LeasingError):
    """The database could not be reached or dropped the connection."""


def one_line(exc: BaseException) -> str:
    """An exception as one line for a log: its class and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
