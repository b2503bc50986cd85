"""What a run in the test's thread did: `HandlerRun`, and `DrainResult` for many."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..services.held import Lease

if TYPE_CHECKING:
    from ..models import Checkpoint, WorkItem

# How a run ended (`HandlerRun.outcome`).
COMPLETED = "completed"
RETRIED = "retried"  # failed; back to pending for another attempt after its backoff
FAILED = "failed"  # failed for good (no retries left, a PermanentError, superseded)
HANDED_BACK = "handed_back"  # the database interrupted it: pending again, no retry counted
LOST = "lost"  # the lease moved on before the ending: nothing was written
OUTCOMES = (COMPLETED, RETRIED, FAILED, HANDED_BACK, LOST)


@dataclass(frozen=True, slots=True)
class HandlerRun:
    """One run of a handler: the item as the run left it, its lease, output and error."""

    item: WorkItem
    lease: Lease
    outcome: str
    output: Any = None  # what the handler returned (`item.output_data` is what was stored)
    error: BaseException | None = None  # what the handler raised
    timed_out: bool = False

    @property
    def attempt(self) -> int:
        """1 for the first run, 2 for the first retry, ..."""
        return self.lease.retry_count + 1

    @property
    def checkpoints(self) -> list[Checkpoint]:
        """The checkpoints of this run's item, oldest first (every attempt's, its
        `error_boundary` records included)."""
        from ..models import Checkpoint

        return list(
            Checkpoint.objects.using(self.item._state.db or "default")
            .filter(task_id=self.lease.task_id, work_item_id=self.lease.work_item_id)
            .order_by("sequence_number")
        )


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What `drain()` ran, in order; `completed`, `failed`, ... list the items by outcome."""

    runs: tuple[HandlerRun, ...] = ()

    def __len__(self) -> int:
        return len(self.runs)

    def __repr__(self) -> str:
        counts = " ".join(f"{name}={count}" for name, count in self.counts.items())
        return f"<DrainResult {counts}>"

    def items(self, outcome: str) -> list[WorkItem]:
        if outcome not in OUTCOMES:
            raise ValueError(f"Unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}.")
        return [run.item for run in self.runs if run.outcome == outcome]

    @property
    def counts(self) -> dict[str, int]:
        """Runs by outcome, every outcome present: `{"completed": 2, "failed": 0, ...}`."""
        return {outcome: len(self.items(outcome)) for outcome in OUTCOMES}

    @property
    def completed(self) -> list[WorkItem]:
        return self.items(COMPLETED)

    @property
    def retried(self) -> list[WorkItem]:
        return self.items(RETRIED)

    @property
    def failed(self) -> list[WorkItem]:
        return self.items(FAILED)

    @property
    def handed_back(self) -> list[WorkItem]:
        return self.items(HANDED_BACK)

    @property
    def lost(self) -> list[WorkItem]:
        return self.items(LOST)

    @property
    def errors(self) -> list[tuple[WorkItem, BaseException]]:
        """Each run that raised: the item and the exception."""
        return [(run.item, run.error) for run in self.runs if run.error is not None]
