"""The statuses, types and roles of the leasing tables.

Plain enumerations, importable before `django.setup()` (unlike the models),
so the statement catalogue, the services and the public API can use them at
import time. `leasing.models` re-exports them.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from .exceptions import InvalidCheckpointType


class WorkItemStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    IN_PROGRESS = "in_progress", "In progress"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    # Final: stopped on request (`leasing.cancel()`, the admin, `manage.py cancel`)
    # before it completed; not a failure of the work.
    CANCELLED = "cancelled", "Cancelled"
    # Allowed by the schema, as the original design lists it; the sweep moves
    # an item from in_progress to pending or failed in one statement, so no
    # row ever rests here.
    EXPIRED = "expired", "Expired"


class UniqueScope(models.TextChoices):
    """How long a work item holds its `unique_key` (see `enqueue(unique_while=...)`)."""

    PENDING = "pending", "While pending"
    UNFINISHED = "unfinished", "While pending or in progress"
    # For a period after enqueue, whatever the status (`unique_until`).
    PERIOD = "period", "For a period after enqueue"


class DependencyFailure(models.TextChoices):
    """What a dependent item does when one of its dependencies fails for good."""

    FAIL = "fail", "Fail with the dependency"
    WAIT = "wait", "Stay blocked"


class LeaseHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    STALE = "stale", "Stale heartbeat"
    EXPIRED = "expired", "Expired, awaiting sweep"


class CheckpointType(models.TextChoices):
    ITERATION_START = "iteration_start", "Iteration start"
    ITERATION_END = "iteration_end", "Iteration end"
    TOOL_EXECUTED = "tool_executed", "Tool executed"
    LLM_RESPONSE = "llm_response", "LLM response"
    APPROVAL_POINT = "approval_point", "Approval point"
    STATE_TRANSITION = "state_transition", "State transition"
    MANUAL_CHECKPOINT = "manual_checkpoint", "Manual checkpoint"
    ERROR_BOUNDARY = "error_boundary", "Error boundary"

    @classmethod
    def validate(cls, value: Any) -> str:
        if value not in cls.values:
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            raise InvalidCheckpointType(
                f"Unknown checkpoint type {shown}; expected one of {', '.join(cls.values)}."
            )
        return str(value)


class IdempotencyStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"


class WorkerRole(models.TextChoices):
    WORKER = "worker", "Worker"
    SWEEPER = "sweeper", "Recovery sweep"


class WorkerStatus(models.TextChoices):
    RUNNING = "running", "Running"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    LOST = "lost", "Lost"


class WorkerRequest(models.TextChoices):
    """What an operator asked a worker process to do (`leasing.services.processes.request`)."""

    QUIET = "quiet", "Quiet"  # stop claiming, finish the running items, keep running
    STOP = "stop", "Stop"  # quiet, then exit as on SIGTERM


class PauseKind(models.TextChoices):
    """What a pause stops claims of (see `leasing.pause()`)."""

    QUEUE = "queue", "Queue"
    WORK_TYPE = "work_type", "Work type"
