"""A small reference model of the work item state machine (the decided semantics).

Pure Python, no database: the model test applies each step here and to the
database, then compares the two. Ids come from the database (the model never
invents one). What the model tracks per item: status, lease holder and token,
retry_count / max_retries, the unique key and scope, dependencies and their
counter, whether a retry's backoff has passed (`ready`) and whether the lease
was made to expire (`expired`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

PENDING, IN_PROGRESS, COMPLETED, FAILED = "pending", "in_progress", "completed", "failed"
CANCELLED = "cancelled"
STATUSES = frozenset({PENDING, IN_PROGRESS, COMPLETED, FAILED, CANCELLED})
# A dependency in one of these never completes (unless an operator retries it).
ENDED = (FAILED, CANCELLED)
FORCE_RELEASE, FORCE_FAIL, RETRY, CANCEL = "force_release", "force_fail", "retry", "cancel"
DELETE, RUN_NOW = "delete", "run_now"
DELETED = "deleted"  # the result's new_status of a deleted item

Key = tuple[str, str]  # (unique_key, unique_scope)
PERIOD = "period"  # a key held for a time whatever the status: holders may overlap


# Which rule of the model test (tests/model/rules.py) drives each transition of
# `leasing.transitions`: a transition added to the table fails tests/unit/test_transitions.py
# until the model knows it.
DRIVEN_BY = {
    "enqueue": "enqueue_batch",
    "claim": "claim",
    "complete": "complete",
    "fail_attempt": "fail",
    "hand_back": "hand_back",
    "expire": "sweep",
    "force_release": "operator_action",
    "force_fail": "operator_action",
    "retry_failed": "operator_action",
    "cancel": "operator_action",
    "delete": "operator_action",
    "run_now": "run_now",
    "dependency_failed": "fail",
    "purge": "purge",
}


@dataclass
class Item:
    id: str
    queue: str
    work_type: str
    max_retries: int
    key: Key | None
    deps: list[str]
    on_dependency_failure: str | None
    status: str = PENDING
    holder: str | None = None
    token: int = 0
    retry_count: int = 0
    dependencies_left: int = 0
    # run_after has passed (a failed attempt's retry waits for its backoff).
    ready: bool = True
    # The lease is past lease_expires_at and not swept yet.
    expired: bool = False
    # The item that held its key when it tried to return to pending.
    superseded_by: str | None = None
    # Asked to stop while running (leasing.cancel): its run's ending cancels it.
    cancel_requested: bool = False
    # Its rate key (each key's bucket admits RATE_BURST claims in all, `Reference.rate_burst`)
    # and its fairness key (a tenant of the fair queue).
    rate_key: str | None = None
    fairness_key: str | None = None
    # A "period" key's period has ended (`end_periods`): it holds the key no more.
    period_over: bool = False
    # Its task, when another item shares it (None: a task of its own), and the place of
    # the newest `iteration_end` it wrote among all (None: none): a task's resume point
    # is its newest one.
    task: str | None = None
    resume_seq: int | None = None

    def holds_key(self) -> bool:
        """ "pending" while pending, "unfinished" while pending or running, "period" until
        its period ends, whatever its status."""
        if self.key is None:
            return False
        if self.key[1] == PERIOD:
            return not self.period_over
        return self.status == PENDING or (
            self.key[1] == "unfinished" and self.status == IN_PROGRESS
        )

    def status_scoped(self) -> bool:
        """Its key is held by a status (the unique index), so a return to pending checks it."""
        return self.key is not None and self.key[1] != PERIOD


@dataclass
class Reference:
    queue_limits: dict[str, int] = field(default_factory=dict)
    type_limits: dict[str, int] = field(default_factory=dict)
    items: dict[str, Item] = field(default_factory=dict)  # in enqueue order
    purged: set[str] = field(default_factory=set)
    paused: set[tuple[str, str]] = field(default_factory=set)  # (kind, name)
    # Rate limits: each rate key's bucket admits this many claims in all (its refill is an
    # hour away), None: no rate limits. Fair queues: claims take turns across the keys.
    rate_burst: int | None = None
    admitted: Counter[str] = field(default_factory=Counter)
    fair_queues: tuple[str, ...] = ()
    resume_points: int = 0  # iteration_end checkpoints written so far

    # --- reads -------------------------------------------------------------------------

    def with_status(self, *statuses: str) -> list[Item]:
        return [item for item in self.items.values() if item.status in statuses]

    def key_holder(self, key: Key | None) -> Item | None:
        if key is None:
            return None
        holders = [i for i in self.items.values() if i.key == key and i.holds_key()]
        assert len(holders) <= 1, f"model: key {key} held by {[i.id for i in holders]}"
        return holders[0] if holders else None

    def dependents(self, item_id: str) -> list[Item]:
        return [i for i in self.items.values() if item_id in i.deps]

    def edges(self) -> set[tuple[str, str]]:
        return {(dep, item.id) for item in self.items.values() for dep in item.deps}

    def claimable(self, queue_filter: str | None = None) -> list[Item]:
        return [
            i
            for i in self.items.values()
            if i.status == PENDING
            and i.dependencies_left == 0
            and i.ready
            and ("queue", i.queue) not in self.paused
            and ("work_type", i.work_type) not in self.paused
            and (queue_filter is None or i.queue == queue_filter)
            and not self.rate_closed(i.rate_key)
        ]

    def rate_closed(self, rate_key: str | None) -> bool:
        """The key's bucket admits nothing more (an item waiting on it stays pending)."""
        return (
            self.rate_burst is not None
            and rate_key is not None
            and self.admitted[rate_key] >= self.rate_burst
        )

    def in_flight(self, attribute: str, name: str) -> int:
        return sum(1 for i in self.with_status(IN_PROGRESS) if getattr(i, attribute) == name)

    def claim_capacity(self, n: int, queue_filter: str | None) -> tuple[int, bool]:
        """The most items a claim of `n` can take, and whether it must take exactly that many.

        With both queue and work type limits the claim may leave a slot unused
        (leasing.sql.limits says so), so the count is then only a bound.
        """
        candidates = self.claimable(queue_filter)
        bounds = [len(candidates)]
        for attribute, limits in (("queue", self.queue_limits), ("work_type", self.type_limits)):
            if not limits:
                continue
            total = 0
            for name, count in Counter(getattr(i, attribute) for i in candidates).items():
                if name in limits:
                    count = min(count, max(0, limits[name] - self.in_flight(attribute, name)))
                total += count
            bounds.append(total)
        # A rate-limited claim admits from its first n candidates only, and a fair claim
        # shares its batch among keys (some of whose items may not be claimable yet).
        exact = not (self.queue_limits and self.type_limits)
        exact = exact and self.rate_burst is None and not self.fair_queues
        return min(n, *bounds), exact

    # --- transitions -------------------------------------------------------------------

    def enqueue(
        self,
        new_id: str,
        *,
        queue: str,
        work_type: str,
        max_retries: int,
        key: Key | None,
        deps: list[str],
        on_dependency_failure: str | None,
    ) -> tuple[str, bool]:
        """The id enqueue returns, and whether it is a duplicate (the key's holder)."""
        holder = self.key_holder(key)
        if holder is not None:
            return holder.id, True
        item = Item(new_id, queue, work_type, max_retries, key, list(deps), on_dependency_failure)
        item.dependencies_left = sum(1 for d in deps if self.items[d].status != COMPLETED)
        self.items[new_id] = item
        if on_dependency_failure == "fail" and any(self.items[d].status in ENDED for d in deps):
            self._fail(item)
        return new_id, False

    def claim(self, item_id: str, worker: str) -> None:
        item = self.items[item_id]
        assert item.status == PENDING
        assert not self.rate_closed(item.rate_key), f"{item_id}: its rate key's bucket is closed"
        if self.rate_burst is not None and item.rate_key is not None:
            self.admitted[item.rate_key] += 1
        item.status, item.holder, item.token, item.expired = (
            IN_PROGRESS,
            worker,
            item.token + 1,
            False,
        )
        item.cancel_requested = False  # a new run

    def complete(self, item_id: str) -> str:
        item = self.items[item_id]
        item.status, item.holder, item.expired = COMPLETED, None, False
        for dependent in self.dependents(item_id):
            dependent.dependencies_left -= 1
        return COMPLETED

    def end_attempt(self, item_id: str, *, retry: bool) -> str:
        """A worker's failed release: back to pending after a backoff while retries are left."""
        item = self.items[item_id]
        if item.cancel_requested:
            self._end(item, CANCELLED)
            return CANCELLED
        if retry and item.retry_count < item.max_retries:
            return self._return_to_pending(item, counted=True, ready=False)
        self._fail(item)
        return FAILED

    def hand_back(self, item_id: str) -> str:
        """requeue_lease / an interruption: back to pending, no retry counted."""
        item = self.items[item_id]
        if item.cancel_requested:
            self._end(item, CANCELLED)
            return CANCELLED
        return self._return_to_pending(item, counted=False, ready=True)

    def sweep(self, expired: list[str], left_pending: set[str], superseded: set[str]) -> None:
        """The sweep's pass over these expired leases.

        Two expired items with one "pending"-scoped key cannot both return to
        pending; which one does is the database's choice (`left_pending`), the
        others are superseded by it. The pass decides every item against the key
        holders it found (one statement), so the items it superseded (`superseded`)
        come next: a holder failed later in the pass, by an expired dependency's
        failure, still superseded them; the rest (failed for good) come last.
        """
        order = sorted(expired, key=lambda i: (i not in left_pending, i not in superseded))
        for item_id in order:
            item = self.items[item_id]
            if item.cancel_requested:
                self._end(item, CANCELLED)
            elif item.retry_count < item.max_retries:
                self._return_to_pending(item, counted=True, ready=True)
            else:
                self._fail(item)

    def forced_stop(self, held: list[str], left_alone: set[str], left_pending: set[str]) -> None:
        """A worker's forced stop hands back every run it holds at once (`requeue_all`).

        Two of them may share a "pending"-scoped key: the one the database
        returned (`left_pending`) comes first and supersedes the others. The
        one statement leaves alone (still running, for the sweep) an item
        something depends on that would be superseded or was asked to stop;
        its one-by-one fallback settles those too.
        """
        for item_id in sorted(held, key=lambda i: i not in left_pending):
            item = self.items[item_id]
            if item_id in left_alone:
                holder = self.key_holder(item.key) if item.status_scoped() else None
                superseded = holder is not None and holder is not item
                assert item.cancel_requested or superseded, f"{item_id} was not handed back"
                continue
            self.hand_back(item_id)

    def periods_running(self) -> bool:
        return any(i.key and i.key[1] == PERIOD and not i.period_over for i in self.items.values())

    def end_periods(self) -> None:
        for item in self.items.values():
            if item.key is not None and item.key[1] == PERIOD:
                item.period_over = True

    def operator(self, action: str, item_id: str, expected_token: int | None) -> str | None:
        """apply_action: None if applied, else why it is skipped ("status", "token",
        "dependency", "key", "requested", "due", "awaited")."""
        item = self.items[item_id]
        accepts = {
            FORCE_RELEASE: (IN_PROGRESS,),
            FORCE_FAIL: (IN_PROGRESS, PENDING),
            RETRY: (FAILED, CANCELLED),
            CANCEL: (PENDING, IN_PROGRESS),
            DELETE: (PENDING, COMPLETED, FAILED, CANCELLED),
            RUN_NOW: (PENDING,),
        }[action]
        if item.status not in accepts:
            return "status"
        if expected_token is not None and expected_token != item.token:
            return "token"
        if action == RUN_NOW:
            if item.ready:
                return "due"
            item.ready = True  # still waits for a pause or its dependencies
        elif action == DELETE:
            if item.status != COMPLETED and self._awaited(item):
                return "awaited"
            self._remove([item.id])
            item.status = DELETED
        elif action == FORCE_RELEASE:
            if item.cancel_requested:  # asked to stop: however its run ends, it is cancelled
                self._end(item, CANCELLED)
            else:
                self._return_to_pending(item, counted=False, ready=True)
        elif action == FORCE_FAIL:
            self._fail(item)
        elif action == CANCEL:
            if item.status == PENDING:
                self._end(item, CANCELLED)
            elif item.cancel_requested:
                return "requested"
            else:
                item.cancel_requested = True  # its run's ending cancels it
        else:
            failed_deps = [d for d in item.deps if self.items[d].status in ENDED]
            if failed_deps and item.on_dependency_failure == "fail":
                return "dependency"
            if item.status_scoped() and self.key_holder(item.key) is not None:
                return "key"
            item.status, item.retry_count, item.ready, item.superseded_by = PENDING, 0, True, None
            item.cancel_requested = False
            # Counted again: a dependency purged since the failure is no longer waited for.
            item.dependencies_left = sum(1 for d in item.deps if self.items[d].status != COMPLETED)
        return None

    def pause(self, kind: str, name: str, paused: bool) -> bool:
        """Whether the pause or resume changed anything."""
        was = (kind, name) in self.paused
        if paused:
            self.paused.add((kind, name))
        else:
            self.paused.discard((kind, name))
        return was != paused

    def let_backoffs_pass(self) -> None:
        for item in self.with_status(PENDING):
            item.ready = True

    def purge(self, statuses: tuple[str, ...]) -> list[str]:
        """Finished items go, but never a failed one an unfinished dependent still waits for,
        nor one whose period key is still held."""

        gone = [
            i.id
            for i in self.items.values()
            if i.status in statuses
            and not (i.status in ENDED and self._awaited(i))
            and not (i.key is not None and i.key[1] == PERIOD and i.holds_key())
            and not self.holds_resume_point(i)
        ]
        self._remove(gone)
        return gone

    def write_resume_point(self, item_id: str) -> None:
        self.resume_points += 1
        self.items[item_id].resume_seq = self.resume_points

    def holds_resume_point(self, item: Item) -> bool:
        """It holds its task's resume point (the newest iteration_end), which another item
        of the task, unfinished, would resume from."""
        if item.task is None or item.resume_seq is None:
            return False
        same = [o for o in self.items.values() if o.task == item.task]
        newest = max(o.resume_seq for o in same if o.resume_seq is not None)
        return item.resume_seq == newest and any(
            o.id != item.id and o.status in (PENDING, IN_PROGRESS) for o in same
        )

    def _awaited(self, item: Item) -> bool:
        """An unfinished dependent waits for it."""
        return any(
            item.id in other.deps and other.status in (PENDING, IN_PROGRESS)
            for other in self.items.values()
        )

    def _remove(self, gone: list[str]) -> None:
        """Deleted items (purged or deleted by an operator); their edges go with them."""
        for item_id in gone:
            del self.items[item_id]
        self.purged.update(gone)
        for item in self.items.values():
            item.deps = [d for d in item.deps if d not in self.purged]

    # --- shared ------------------------------------------------------------------------

    def _return_to_pending(self, item: Item, *, counted: bool, ready: bool) -> str:
        """Every transition into pending checks a status-scoped key: held by another, it is
        superseded. A period key is not checked (its holders overlap by design)."""
        holder = self.key_holder(item.key) if item.status_scoped() else None
        if holder is not None and holder is not item:
            self._fail(item, superseded_by=holder.id)
            return FAILED
        item.status, item.holder, item.expired, item.ready = PENDING, None, False, ready
        item.retry_count += 1 if counted else 0
        return PENDING

    def _fail(self, item: Item, *, superseded_by: str | None = None) -> None:
        """Failed for good; dependents that fail with their dependencies follow (recursively)."""
        self._end(item, FAILED, superseded_by=superseded_by)

    def _end(self, item: Item, status: str, *, superseded_by: str | None = None) -> None:
        """Ended without completing (failed or cancelled); dependents that fail with their
        dependencies fail (recursively)."""
        item.status, item.holder, item.expired, item.superseded_by = (
            status,
            None,
            False,
            superseded_by,
        )
        for dependent in self.dependents(item.id):
            if dependent.status == PENDING and dependent.on_dependency_failure == "fail":
                self._fail(dependent)
