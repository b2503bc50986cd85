"""The model test's state machine: its set-up, the producers' rules and the check after
every step (tests/model/rules.py adds the workers', the sweep's and operators' rules).

Each example starts from empty tables with three workers, two queues, two work
types and one unique key name; a rule calls the app, then applies the same step to
`tests.model.reference.Reference`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.test import override_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import leasing

from . import database as db
from .invariants import check_invariants, compare_with_model
from .reference import IN_PROGRESS, Item, Reference

WORKERS = ("w1", "w2", "w3")
QUEUES = ("q1", "q2")
TYPES = ("model.a", "model.b")
# One key name: with its two scopes that is two keys, which collide often enough to
# reach every transition into pending while another item holds the key.
KEYS = ("k",)
SCOPES = ("pending", "unfinished", "period")
# A period key's period: long enough that only `end_periods` ends it.
PERIOD_LENGTH = timedelta(hours=1)
LIMITS = st.sampled_from([{}, {"q1": 2}, {"q2": 1}])
TYPE_LIMITS = st.sampled_from([{}, {}, {"model.b": 1}])
# Rate keys and fairness keys (tenants) of the items; q2 may be a fair queue, and each
# rate key's bucket may admit RATE_BURST claims in all (one an hour after that).
RATE_KEYS = ("r1", "r2")
FAIRNESS_KEYS = ("t1", "t2", "t3")
RATE_BURST = 2


def unique_while(scope: str) -> str | timedelta:
    """The `unique_while` that gives a key this scope."""
    return PERIOD_LENGTH if scope == "period" else scope


class ModelMachine(RuleBasedStateMachine):
    """Set-up, the producers' rules and the check after every step."""

    def __init__(self) -> None:
        super().__init__()
        db.clean()
        self.ref = Reference()
        self.managers = {w: leasing.LeaseManager(w) for w in WORKERS}
        self.sweep_pass = leasing.RecoverySweep(scan_interval_seconds=60)
        self.granted: list[tuple[str, str, int]] = []  # every lease: (worker, item, token)
        self.override: override_settings | None = None
        self.enqueued = 0

    @initialize(
        queue_limits=LIMITS,
        type_limits=TYPE_LIMITS,
        rate_limited=st.booleans(),
        fair=st.booleans(),
    )
    def configure(
        self,
        queue_limits: dict[str, int],
        type_limits: dict[str, int],
        rate_limited: bool,
        fair: bool,
    ) -> None:
        # A retry's backoff is an hour, so that only `let_backoffs_pass` makes it claimable.
        # A rate key's bucket: one an hour, and a burst that lets RATE_BURST through at once.
        rates = {"key:*": {"limit": 1, "per": 3600, "burst": RATE_BURST}} if rate_limited else {}
        self.override = override_settings(
            LEASING={
                **django_settings.LEASING,
                "RETRY_BACKOFF_BASE": 3600,
                "QUEUE_LIMITS": queue_limits,
                "WORK_TYPE_LIMITS": type_limits,
                "RATE_LIMITS": rates,
                "FAIR_QUEUES": [QUEUES[1]] if fair else [],
            }
        )
        self.override.enable()
        self.ref.queue_limits, self.ref.type_limits = queue_limits, type_limits
        self.ref.rate_burst = RATE_BURST if rate_limited else None
        self.ref.fair_queues = (QUEUES[1],) if fair else ()

    @initialize(scopes=st.lists(st.sampled_from(SCOPES), max_size=2, unique=True))
    def seed_keys(self, scopes: list[str]) -> None:
        """Keyed items first in claim order (priority 1), so that examples often run one."""
        for scope in scopes:
            item = leasing.enqueue(
                f"seed-{scope}",
                TYPES[0],
                priority=1,
                max_retries=1,
                queue_name=QUEUES[0],
                unique_key=KEYS[0],
                unique_while=unique_while(scope),
            )
            expected = self.ref.enqueue(
                item.work_item_id,
                queue=QUEUES[0],
                work_type=TYPES[0],
                max_retries=1,
                key=(KEYS[0], scope),
                deps=[],
                on_dependency_failure=None,
            )
            assert (item.work_item_id, item.duplicate) == expected

    def teardown(self) -> None:
        if self.override is not None:
            self.override.disable()

    # --- helpers ---------------------------------------------------------------------

    def draw_item(self, data: st.DataObject, *statuses: str) -> Item:
        ids = [i.id for i in self.ref.with_status(*statuses)]
        return self.ref.items[data.draw(st.sampled_from(ids), label="item")]

    def token_arg(self, data: st.DataObject, item: Item) -> int | None:
        """The token to name: None (the manager's newest lease) when the manager holds it."""
        lease = self.managers[item.holder or WORKERS[0]].lease_for(item.id)
        if lease is not None and lease.token == item.token and data.draw(st.booleans()):
            return None
        return item.token

    def stale_leases(self) -> list[tuple[str, str, int]]:
        """Leases that moved on: the item was released, recovered, re-claimed or purged."""
        live = {(i.holder, i.id, i.token) for i in self.ref.with_status(IN_PROGRESS)}
        return sorted(set(self.granted) - live)

    # --- producers -------------------------------------------------------------------

    @rule(
        data=st.data(),
        queue=st.sampled_from(QUEUES),
        work_type=st.sampled_from(TYPES),
        max_retries=st.integers(0, 2),
        key=st.none() | st.tuples(st.sampled_from(KEYS), st.sampled_from(SCOPES)),
        on_failure=st.sampled_from(["fail", "wait"]),
        priority=st.integers(0, 1),
        rate_key=st.none() | st.sampled_from(RATE_KEYS),
        fairness_key=st.none() | st.sampled_from(FAIRNESS_KEYS),
    )
    def enqueue(
        self,
        data: st.DataObject,
        queue: str,
        work_type: str,
        max_retries: int,
        key: tuple[str, str] | None,
        on_failure: str,
        priority: int,
        rate_key: str | None,
        fairness_key: str | None,
    ) -> None:
        """One item; a priority above the batches' lets keyed items be claimed ahead of them."""
        existing = list(self.ref.items)
        deps = []
        if existing and data.draw(st.booleans()):
            deps = data.draw(st.lists(st.sampled_from(existing), max_size=2, unique=True))
        rules: dict[str, Any] = {}
        if key is not None:
            rules.update(unique_key=key[0], unique_while=unique_while(key[1]))
        if deps:
            rules.update(depends_on=deps, on_dependency_failure=on_failure)
        self.enqueued += 1
        item = leasing.enqueue(
            f"task-{self.enqueued}",
            work_type,
            {"n": self.enqueued},
            priority=priority,
            max_retries=max_retries,
            queue_name=queue,
            rate_key=rate_key,
            fairness_key=fairness_key,
            **rules,
        )
        expected_id, duplicate = self.ref.enqueue(
            item.work_item_id,
            queue=queue,
            work_type=work_type,
            max_retries=max_retries,
            key=key,
            deps=deps,
            on_dependency_failure=on_failure if deps else None,
        )
        assert (item.work_item_id, item.duplicate) == (expected_id, duplicate)
        if not duplicate:
            self.ref.items[expected_id].rate_key = rate_key
            self.ref.items[expected_id].fairness_key = fairness_key

    def keys_let_go(self) -> list[str]:
        """Items with a key that nobody holds now (running under "pending", finished)."""
        return [
            i.id
            for i in self.ref.items.values()
            if i.key is not None and self.ref.key_holder(i.key) is None
        ]

    @precondition(lambda self: self.keys_let_go())
    @rule(data=st.data())
    def enqueue_same_key(self, data: st.DataObject) -> None:
        """A new holder of the key of an item that let it go: what that item meets when it
        returns to pending, or when an operator retries it."""
        item = self.ref.items[data.draw(st.sampled_from(self.keys_let_go()), label="key of")]
        assert item.key is not None
        self.enqueued += 1
        new = leasing.enqueue(
            f"task-{self.enqueued}",
            item.work_type,
            queue_name=item.queue,
            max_retries=item.max_retries,
            unique_key=item.key[0],
            unique_while=unique_while(item.key[1]),
        )
        expected = self.ref.enqueue(
            new.work_item_id,
            queue=item.queue,
            work_type=item.work_type,
            max_retries=item.max_retries,
            key=item.key,
            deps=[],
            on_dependency_failure=None,
        )
        assert (new.work_item_id, new.duplicate) == expected

    @precondition(lambda self: self.ref.items)
    @rule(data=st.data())
    def enqueue_under_task(self, data: st.DataObject) -> None:
        """A new item of an existing item's task (a failed run enqueued again): it resumes
        from the task's newest iteration_end, so a purge must leave that one."""
        # Mostly an item that wrote a resume point: the case a purge must get right.
        resumable = [i.id for i in self.ref.items.values() if i.resume_seq is not None]
        ids = resumable if resumable and data.draw(st.integers(0, 3)) else list(self.ref.items)
        item = self.ref.items[data.draw(st.sampled_from(ids), label="task of")]
        [row] = db.fetch("SELECT task_id FROM work_items WHERE work_item_id = %s", [item.id])
        new = leasing.enqueue(
            row["task_id"], item.work_type, queue_name=item.queue, max_retries=item.max_retries
        )
        expected = self.ref.enqueue(
            new.work_item_id,
            queue=item.queue,
            work_type=item.work_type,
            max_retries=item.max_retries,
            key=None,
            deps=[],
            on_dependency_failure=None,
        )
        assert (new.work_item_id, new.duplicate) == expected
        item.task = self.ref.items[new.work_item_id].task = row["task_id"]

    @precondition(lambda self: self.ref.with_status(IN_PROGRESS))
    @rule(data=st.data())
    def write_resume_point(self, data: st.DataObject) -> None:
        """A running handler's checkpoint to resume from (`iteration_end`)."""
        item = self.draw_item(data, IN_PROGRESS)
        [row] = db.fetch("SELECT task_id FROM work_items WHERE work_item_id = %s", [item.id])
        leasing.create_checkpoint(row["task_id"], "iteration_end", {"i": 1}, work_item=item.id)
        item.task = item.task or row["task_id"]
        self.ref.write_resume_point(item.id)

    @rule(
        data=st.data(),
        specs=st.lists(
            st.tuples(
                st.sampled_from(QUEUES),
                st.sampled_from(TYPES),
                st.integers(0, 2),
                st.sampled_from(["fail", "wait"]),
            ),
            min_size=1,
            max_size=3,
        ),
    )
    def enqueue_batch(self, data: st.DataObject, specs: list[tuple[str, str, int, str]]) -> None:
        """enqueue_many: a plain batch is one INSERT; one with dependencies takes the rules path.

        Without unique keys: how a batch resolves a key between its own items
        is the batch's rule, not the state machine's.
        """
        batch, expected = [], []
        for queue, work_type, max_retries, on_failure in specs:
            existing = list(self.ref.items)
            deps = []
            if existing and data.draw(st.booleans()):
                deps = data.draw(st.lists(st.sampled_from(existing), max_size=2, unique=True))
            self.enqueued += 1
            spec: dict[str, Any] = {
                "task_id": f"task-{self.enqueued}",
                "work_type": work_type,
                "queue_name": queue,
                "max_retries": max_retries,
            }
            if deps:
                spec.update(depends_on=deps, on_dependency_failure=on_failure)
            batch.append(spec)
            expected.append((queue, work_type, max_retries, deps, on_failure if deps else None))
        items = leasing.enqueue_many(batch)
        assert len(items) == len(batch)
        for item, (queue, work_type, max_retries, deps, on_failure) in zip(
            items, expected, strict=True
        ):
            assert not item.duplicate
            self.ref.enqueue(
                item.work_item_id,
                queue=queue,
                work_type=work_type,
                max_retries=max_retries,
                key=None,
                deps=deps,
                on_dependency_failure=on_failure,
            )

    # --- after every step --------------------------------------------------------------

    @invariant()
    def database_matches_model(self) -> None:
        rows, edges = db.rows(), db.edges()
        check_invariants(rows, edges, self.ref)
        compare_with_model(rows, edges, self.ref)
