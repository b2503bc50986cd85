"""What a fault run leaves behind, as plain values the checker reads.

Four sources, each with its own reason to be trusted:

- `Change`: one row of the database's journal (`tests.faults.journal`), written
  by a trigger on `work_items` in the transaction that changed the row, so it
  exists exactly when the change committed, whatever happened to the process.
- `Effect`: one row of the ledger that `run_once(..., atomic=True)` effects
  insert, in the transaction that records their idempotency key.
- `Record`: what a process was told by leasing's signals (a claim, a renewal,
  a release, an expiry), appended to a file after the change committed. A
  process killed between the commit and the append loses that record, so
  records are checked against the journal, never the other way round.
- `FinalItem`: a work item's row once the run settled.

Times are integer microseconds since the epoch, from the database clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IN_PROGRESS = "in_progress"
TERMINAL = frozenset({"completed", "failed"})


@dataclass(frozen=True, slots=True)
class Change:
    """One committed change of a work item's status, token or lease expiry."""

    seq: int
    at: int  # clock_timestamp() when the trigger ran (before the commit)
    stmt: int  # statement_timestamp() of the statement that made the change
    op: str  # INSERT, UPDATE or DELETE
    item: str
    work_type: str
    queue: str
    old_status: str | None
    new_status: str | None
    old_token: int | None
    new_token: int | None
    old_holder: str | None
    new_holder: str | None
    old_expires: int | None
    new_expires: int | None
    deadline: int | None
    acquired: int | None

    @property
    def is_claim(self) -> bool:
        return self.old_status != IN_PROGRESS and self.new_status == IN_PROGRESS

    @property
    def is_end(self) -> bool:
        """The end of a lease: the item left in_progress (or was deleted while in it)."""
        return self.old_status == IN_PROGRESS and self.new_status != IN_PROGRESS

    @property
    def is_renewal(self) -> bool:
        return (
            self.old_status == IN_PROGRESS
            and self.new_status == IN_PROGRESS
            and self.old_token == self.new_token
            and self.old_expires != self.new_expires
        )

    @property
    def is_completion(self) -> bool:
        return self.old_status == IN_PROGRESS and self.new_status == "completed"


@dataclass(frozen=True, slots=True)
class Effect:
    """One row a `run_once(atomic=True)` effect inserted."""

    seq: int
    key: str
    item: str
    token: int
    worker: str
    at: int


@dataclass(frozen=True, slots=True)
class Record:
    """One signal a process received: kind is claim, renew, release or expire."""

    kind: str
    item: str
    token: int
    worker: str
    proc: str = ""
    status: str | None = None  # release and expire: the item's new status
    expires: int | None = None  # claim and renew: the lease's expiry
    deadline: int | None = None  # claim: the lease's deadline

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        return cls(
            kind=data["kind"],
            item=data["item"],
            token=int(data["token"]),
            worker=data.get("worker") or "",
            proc=data.get("proc", ""),
            status=data.get("status"),
            expires=data.get("expires"),
            deadline=data.get("deadline"),
        )


@dataclass(frozen=True, slots=True)
class FinalItem:
    """A work item once the run settled."""

    item: str
    work_type: str
    queue: str
    status: str
    token: int
    output: Any = None  # the completing run's stamp: {"token": ..., "worker": ...}
    tick: str | None = None  # a schedule's item: the tick it was enqueued for
    schedule: str | None = None


@dataclass(frozen=True, slots=True)
class Edge:
    """`dependent` may start only once `dependency` completed."""

    dependency: str
    dependent: str


@dataclass(frozen=True, slots=True)
class Violation:
    prop: str
    item: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.prop}] {self.item}: {self.detail}"
