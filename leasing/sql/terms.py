"""What a claim asks for: its lease terms and its filters (validated by the caller)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """How long a claimed lease lasts, by work type (seconds, validated by the caller).

    `duration` is renewed by heartbeats; `cap` is the most a lease can live
    from its claim, whatever the renewals. `durations` and `caps` give some
    work types their own values.
    """

    duration: float
    cap: float
    durations: Mapping[str, float] = field(default_factory=dict)
    caps: Mapping[str, float] = field(default_factory=dict)

    def duration_for(self, work_type: str) -> float:
        return self.durations.get(work_type, self.duration)

    def cap_for(self, work_type: str) -> float:
        return self.caps.get(work_type, self.cap)


@dataclass(frozen=True, slots=True)
class ClaimFilters:
    """Which pending items a claim may take (None: any)."""

    work_types: tuple[str, ...] | None = None
    queues: tuple[str, ...] | None = None
    task_ids: tuple[str, ...] | None = None
    # Items the claimer must not take (a worker's abandoned runs, still running).
    exclude_ids: tuple[str, ...] = ()
    # Only items available for at least this many seconds: a poll by a worker that
    # does not answer wakes leaves the fresh ones to the worker that does.
    settled_s: float = 0.0
