"""The work item state machine, declared once.

Every statement that writes `work_items.status` takes its status SQL from a
`Transition` below (`Transition.sets()` and `Transition.leaves()`), and a
test-time guard built from `allowed_moves()` makes the database refuse any
other change of status (see `leasing.storage`), so a transition that is not
declared here cannot happen unnoticed.

Features that care about statuses (unique keys, dependencies, pauses,
concurrency limits, the lease fence) each state, in `GUARDS`, what they
require of every transition into or out of those statuses. A transition added
here without a rule of every feature it concerns fails
`tests/unit/test_transitions.py`, and the model test (`tests/db/test_state_model.py`)
drives each transition against a reference model.

Importable before `django.setup()`, like `leasing.states`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .states import WorkItemStatus

PENDING = WorkItemStatus.PENDING.value
IN_PROGRESS = WorkItemStatus.IN_PROGRESS.value
COMPLETED = WorkItemStatus.COMPLETED.value
FAILED = WorkItemStatus.FAILED.value
CANCELLED = WorkItemStatus.CANCELLED.value
# The statuses a row may rest in. `expired` is allowed by the schema's CHECK
# constraint (the original design lists it) but no transition enters it: the
# sweep moves an expired lease straight to pending or failed.
RESTING = (PENDING, IN_PROGRESS, COMPLETED, FAILED, CANCELLED)
FINISHED = (COMPLETED, FAILED, CANCELLED)
NEW = "new"  # the source of an insert
GONE = "gone"  # the target of a delete


def quoted(status: str) -> str:
    """A status as an SQL literal."""
    return f"'{status}'"


@dataclass(frozen=True, slots=True)
class Transition:
    """One way a work item's status changes.

    `sources` are the statuses it leaves (`NEW`: an insert), `targets` the
    statuses it may leave the row in (`GONE`: a delete); a statement chooses
    among several targets with a condition (`sets()`). `actor` says who
    takes it; `fenced`: only the lease's holder, by its token.
    """

    name: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    actor: str
    fenced: bool
    summary: str

    def moves(self) -> set[tuple[str, str]]:
        """Every (from, to) status pair this transition may write."""
        return {(a, b) for a in self.sources for b in self.targets if a != b}

    def leaves(self, row: str = "") -> str:
        """SQL: the row is in one of this transition's source statuses."""
        column = f"{row}.status" if row else "status"
        statuses = [s for s in self.sources if s != NEW]
        if len(statuses) == 1:
            return f"{column} = {quoted(statuses[0])}"
        return f"{column} IN ({', '.join(quoted(s) for s in statuses)})"

    def sets(self, when: Mapping[str, str] | None = None) -> str:
        """SQL: `status = ...` for this transition.

        One target needs no condition. Several: `when` maps each target but
        the last to the SQL condition that chooses it (tried in order); the
        last target listed in `targets` not in `when` is the ELSE.
        """
        targets = [t for t in self.targets if t != GONE]
        if when is None:
            if len(targets) != 1:
                raise ValueError(f"{self.name}: choose among {targets} with `when`")
            return f"status = {quoted(targets[0])}"
        unknown = set(when) - set(targets)
        rest = [t for t in targets if t not in when]
        if unknown or len(rest) != 1:
            raise ValueError(f"{self.name}: `when` must cover all targets but one of {targets}")
        whens = " ".join(f"WHEN {cond} THEN {quoted(t)}" for t, cond in when.items())
        return f"status = CASE {whens} ELSE {quoted(rest[0])} END"

    def target(self) -> str:
        """SQL: this transition's one target status, as a literal (an INSERT's value)."""
        [target] = [t for t in self.targets if t != GONE]
        return quoted(target)

    def sets_if(self, condition: str, row: str = "") -> str:
        """SQL: `status = ...` taking this transition's one target where `condition` holds,
        leaving the others' status as it is."""
        [target] = [t for t in self.targets if t != GONE]
        column = f"{row}.status" if row else "status"
        return f"status = CASE WHEN {condition} THEN {quoted(target)} ELSE {column} END"


def _t(
    name: str, sources: tuple[str, ...], targets: tuple[str, ...], actor: str, summary: str
) -> Transition:
    fenced = actor == "worker" and sources == (IN_PROGRESS,)
    return Transition(name, sources, targets, actor, fenced, summary)


ENQUEUE = _t("enqueue", (NEW,), (PENDING,), "producer", "A new item, claimable once due.")
CLAIM = _t("claim", (PENDING,), (IN_PROGRESS,), "worker", "A worker takes a lease (token + 1).")
COMPLETE = _t("complete", (IN_PROGRESS,), (COMPLETED,), "worker", "The handler succeeded.")
# A failed attempt (the handler raised, its output could not be stored, it
# ran into its deadline): retried after a backoff while retries are left,
# else failed for good; failed too when its unique key is held (superseded).
FAIL_ATTEMPT = _t(
    "fail_attempt",
    (IN_PROGRESS,),
    (PENDING, CANCELLED, FAILED),
    "worker",
    "An attempt failed: retried while retries are left, else failed (cancelled if it had "
    "been asked to stop).",
)
# Given back without counting an attempt: a stopping worker's unfinished run,
# or one the database cut short (counted in `interruptions`).
HAND_BACK = _t(
    "hand_back",
    (IN_PROGRESS,),
    (PENDING, CANCELLED, FAILED),
    "worker",
    "A worker gives the item back unfinished; no attempt counted (cancelled if it had been "
    "asked to stop).",
)
EXPIRE = _t(
    "expire",
    (IN_PROGRESS,),
    (PENDING, CANCELLED, FAILED),
    "sweep",
    "The lease ran out: retried while retries are left and the type allows, else failed "
    "(cancelled if it had been asked to stop).",
)
# Asked to stop, it ends cancelled like any other ending of its run: a new run
# would do the work the operator asked to stop.
FORCE_RELEASE = _t(
    "force_release",
    (IN_PROGRESS,),
    (PENDING, CANCELLED, FAILED),
    "operator",
    "An operator takes the lease away; the item is claimable again (cancelled if it had "
    "been asked to stop).",
)
FORCE_FAIL = _t(
    "force_fail", (IN_PROGRESS, PENDING), (FAILED,), "operator", "An operator fails the item."
)
RETRY_FAILED = _t(
    "retry_failed",
    (FAILED, CANCELLED),
    (PENDING,),
    "operator",
    "An operator runs a failed or cancelled item again, its retries counted from 0.",
)
# A running item is not cancelled by a transition of its own: it is asked to
# stop (`cancel_requested_at`, no status change), and the ending of its run
# (a failed attempt, a hand-back, an expired lease) then leaves it cancelled.
CANCEL = _t(
    "cancel",
    (PENDING,),
    (CANCELLED,),
    "operator",
    "An item not yet running is cancelled at once (`leasing.cancel()`, the admin, the command).",
)
# An operator removes an item for good (Sidekiq's and Oban Web's "delete"): one not yet
# claimed, or a finished one. Its checkpoints and edges go with it; the audit record
# of the deletion stays on its task (a checkpoint not tied to the item).
DELETE = _t(
    "delete",
    (PENDING, COMPLETED, FAILED, CANCELLED),
    (GONE,),
    "operator",
    "An operator deletes an item not yet running, or a finished one, with a reason.",
)
# A deferred item (a retry's backoff, a scheduled run) made due now: no change of
# status, only `run_after` moved to the database's now.
RUN_NOW = _t(
    "run_now",
    (PENDING,),
    (PENDING,),
    "operator",
    "An operator makes a deferred pending item due now (run_after = the database's now).",
)
DEPENDENCY_FAILED = _t(
    "dependency_failed",
    (PENDING,),
    (FAILED,),
    "dependencies",
    "A dependency failed for good and the item fails with its dependencies.",
)
PURGE = _t(
    "purge", FINISHED, (GONE,), "retention", "Finished items older than the age are deleted."
)

TRANSITIONS: tuple[Transition, ...] = (
    ENQUEUE,
    CLAIM,
    COMPLETE,
    FAIL_ATTEMPT,
    HAND_BACK,
    EXPIRE,
    FORCE_RELEASE,
    FORCE_FAIL,
    RETRY_FAILED,
    CANCEL,
    DELETE,
    RUN_NOW,
    DEPENDENCY_FAILED,
    PURGE,
)


def allowed_moves() -> set[tuple[str, str]]:
    """Every (from, to) pair of statuses some transition writes (NEW / GONE for rows)."""
    return {move for t in TRANSITIONS for move in t.moves()}


@dataclass(frozen=True, slots=True)
class Guard:
    """What one feature requires of the transitions that touch the statuses it cares about."""

    feature: str
    statuses: tuple[str, ...]
    rules: Mapping[str, str]  # transition name -> the rule


_HELD = "unique_while='pending': held while pending; 'unfinished': while pending or in progress"
GUARDS: tuple[Guard, ...] = (
    Guard(
        "fence",
        (IN_PROGRESS,),
        {
            "claim": "sets a new token (token + 1), holder and lease times from the database clock",
            "complete": "matches (holder, token, in_progress): a stale worker changes nothing",
            "fail_attempt": "matches (holder, token, in_progress)",
            "hand_back": "matches (holder, token, in_progress)",
            "expire": "only a lease past its expiry (database clock), with the token it locked",
            "force_release": "the status and token the operator saw (the admin's per-item "
            "confirmation: its heartbeat too)",
            "force_fail": "as force_release",
            "cancel": "the status (and token) the operator saw",
            "delete": "never an item in progress; the status and token the operator saw",
            "run_now": "pending only, with the token the operator saw: a claimed item is "
            "left alone",
        },
    ),
    Guard(
        "unique_key",
        (PENDING, IN_PROGRESS),
        {
            "enqueue": f"{_HELD}; a held key returns its holder and inserts nothing",
            "claim": "'pending' releases the key; 'unfinished' keeps it (same row, no conflict)",
            "complete": "releases the key",
            "fail_attempt": "back to pending only if no other item holds the key; else superseded "
            "(failed, 'Superseded by <holder>'); a period key is not checked (its holders "
            "overlap by design)",
            "hand_back": "as fail_attempt; of several items of one key handed back together "
            "(a forced stop), one returns",
            "expire": "as fail_attempt; of several expired items of one status-scoped key, the "
            "lowest id returns",
            "force_release": "as fail_attempt; asked to stop, it ends cancelled, which "
            "releases the key",
            "force_fail": "releases the key",
            "retry_failed": "skipped (nothing written) while another item holds the key",
            "cancel": "releases the key",
            "dependency_failed": "releases the key",
            "delete": "a deleted pending item releases its key with its row",
            "purge": "never an item whose period key is still held (unique_until ahead): the "
            "row holds the key, whatever its status, until its period ends",
            "run_now": "unchanged: the item keeps (or lacks) its key",
        },
    ),
    Guard(
        "dependencies",
        (PENDING, COMPLETED, FAILED, CANCELLED),
        {
            "enqueue": "dependencies_left starts at the dependencies not completed; an item whose "
            "dependency already failed and that fails with it is failed at once",
            "claim": "only items with dependencies_left = 0",
            "complete": "each dependent's dependencies_left goes down by its edges to the item",
            "fail_attempt": "failed for good: dependents that chose 'fail' fail with it",
            "hand_back": "superseded: as fail_attempt",
            "expire": "failed for good: as fail_attempt",
            "force_release": "superseded, or cancelled (asked to stop): as fail_attempt",
            "force_fail": "as fail_attempt",
            "retry_failed": "skipped while a dependency failed and the item fails with it; "
            "only the item returns: its dependents that failed with it stay failed until each "
            "is retried (the result and its audit record count them)",
            "cancel": "as fail_attempt: dependents that chose 'fail' fail, 'wait' ones wait",
            "dependency_failed": "its own dependents that chose 'fail' fail in turn",
            "purge": "never a failed item an unfinished dependent still waits for; "
            "otherwise its edges go with it",
            "delete": "skipped while an unfinished dependent waits for it (not completed: it "
            "would wait forever; cancel a pending one instead, retry a failed or cancelled one "
            "or end what waits for it); otherwise its edges go with it",
            "run_now": "still waits for its dependencies (dependencies_left is unchanged)",
        },
    ),
    Guard(
        "pauses",
        (PENDING,),
        {
            "claim": "never an item of a paused queue or work type",
            "enqueue": "allowed while paused (the item waits)",
            "fail_attempt": "a retry waits while paused",
            "hand_back": "waits while paused",
            "expire": "a retry waits while paused",
            "force_release": "waits while paused",
            "retry_failed": "waits while paused",
            "force_fail": "allowed while paused",
            "cancel": "allowed while paused",
            "dependency_failed": "allowed while paused",
            "delete": "allowed while paused",
            "run_now": "still waits while paused: only its time is moved",
        },
    ),
    Guard(
        "limits",
        (IN_PROGRESS,),
        {
            "claim": "never past a queue's or work type's limit of items in progress "
            "(QUEUE_LIMITS, WORK_TYPE_LIMITS), counted under an advisory lock",
            "complete": "frees a place",
            "fail_attempt": "frees a place",
            "hand_back": "frees a place",
            "expire": "frees a place",
            "force_release": "frees a place",
            "force_fail": "frees a place",
        },
    ),
    Guard(
        "rate_limits",
        (PENDING,),
        {
            "claim": "only items every bucket of theirs admits (RATE_LIMITS, an enqueue's "
            "rate_limit), under the buckets' row locks at the database clock; an item waiting "
            "on one stays pending, uncharged (no attempt, no retry)",
            "enqueue": "allowed whatever the buckets hold (the item waits); a rate_limit sets "
            "its key's limit",
            "fail_attempt": "a retry waits for its bucket like a new item; the failed attempt "
            "was charged once, at its claim",
            "hand_back": "waits for its bucket again (its claim was charged)",
            "expire": "a retry waits for its bucket again",
            "force_release": "waits for its bucket again",
            "retry_failed": "waits for its bucket",
            "force_fail": "allowed; nothing is charged",
            "cancel": "allowed; nothing is charged",
            "dependency_failed": "allowed; nothing is charged",
            "delete": "allowed; nothing is charged",
            "run_now": "still waits for its bucket: only its time is moved",
        },
    ),
    Guard(
        "fairness",
        (PENDING,),
        {
            "claim": "in a queue of FAIR_QUEUES, claims take turns across fairness keys (each "
            "key at most 2 x ceil(n / keys) x its weight of a claim of n; a lone key n x its "
            "weight)",
            "enqueue": "allowed; the item takes its key's turns",
            "fail_attempt": "a retry takes its key's turns again",
            "hand_back": "takes its key's turns again",
            "expire": "a retry takes its key's turns again",
            "force_release": "takes its key's turns again",
            "retry_failed": "takes its key's turns",
            "force_fail": "allowed",
            "cancel": "allowed",
            "dependency_failed": "allowed",
            "delete": "allowed",
            "run_now": "still takes its key's turns: only its time is moved",
        },
    ),
    Guard(
        "cancellation",
        (PENDING, IN_PROGRESS, CANCELLED),
        {
            "enqueue": "a new item is never asked to stop",
            "claim": "a claim clears any old request to stop (it is a new run)",
            "complete": "a run that completes though asked to stop is completed: its work is done",
            "fail_attempt": "asked to stop, the run ends cancelled: not retried, not failed",
            "hand_back": "asked to stop, the item ends cancelled instead of waiting for a run",
            "expire": "asked to stop, an expired lease ends cancelled, not retried",
            "force_release": "asked to stop, the item ends cancelled, not back to pending: "
            "no new run starts",
            "force_fail": "allowed; the request is moot",
            "retry_failed": "a cancelled item may be retried, its request cleared",
            "cancel": "pending only; a running item is asked to stop instead "
            "(cancel_requested_at), seen by its handler within one heartbeat interval",
            "dependency_failed": "allowed",
            "purge": "cancelled items are purged like the other finished ones",
            "delete": "a pending item asked nothing; cancelled ones are deleted like the others",
            "run_now": "pending only: no run to stop",
        },
    ),
    Guard(
        "resume_point",
        (GONE,),
        {
            "purge": "never an item holding its task's resume point (its newest iteration_end) "
            "while another item of the task is pending or in progress: that one resumes from it",
            "delete": "the operator's choice: the item's checkpoints go with it, its task's "
            "resume point included (another item of the task then starts over)",
        },
    ),
)


__all__ = [
    "CLAIM",
    "COMPLETE",
    "DELETE",
    "DEPENDENCY_FAILED",
    "ENQUEUE",
    "EXPIRE",
    "FAIL_ATTEMPT",
    "FORCE_FAIL",
    "FORCE_RELEASE",
    "GUARDS",
    "HAND_BACK",
    "PURGE",
    "RETRY_FAILED",
    "RUN_NOW",
    "TRANSITIONS",
    "Guard",
    "Transition",
    "allowed_moves",
]
