"""The model test's rules: the workers', the sweep's and the operators' steps on top of
`tests.model.machine.ModelMachine`, each checked against `tests.model.reference`."""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

import leasing
from leasing.exceptions import LeaseError, PayloadNotSerializable
from leasing.services.retention import purge_finished_items
from tests.model import database as db
from tests.model.machine import QUEUES, TYPES, WORKERS, ModelMachine
from tests.model.reference import CANCELLED, COMPLETED, FAILED, IN_PROGRESS, PENDING, STATUSES

# What release_lease's output_data cannot hold as JSON.
UNSTORABLE = (float("nan"), math.inf, {1, 2}, datetime(2026, 1, 1, tzinfo=UTC), "nul\x00")


class LeasingMachine(ModelMachine):
    """The workers', the sweep's and the operators' rules (the rest: tests/model/machine.py)."""

    # --- workers ---------------------------------------------------------------------

    @rule(
        worker=st.sampled_from(WORKERS),
        n=st.integers(1, 3),
        queue_filter=st.none() | st.sampled_from(QUEUES),
    )
    def claim(self, worker: str, n: int, queue_filter: str | None) -> None:
        manager = self.managers[worker]
        claimable = {i.id for i in self.ref.claimable(queue_filter)}
        most, exact = self.ref.claim_capacity(n, queue_filter)
        if n == 1 and queue_filter is None:
            lease = manager.acquire_lease()
            leases = [lease] if lease is not None else []
        else:
            leases = manager.acquire_leases(n, queue_filter=queue_filter)
        got = [lease.work_item_id for lease in leases]
        assert len(set(got)) == len(got), f"one item claimed twice in a batch: {got}"
        assert set(got) <= claimable, f"claimed {set(got) - claimable}, which are not claimable"
        assert len(got) == most if exact else len(got) <= most, (got, most)
        self.check_turns(got, n, claimable)
        for lease in leases:
            item = self.ref.items[lease.work_item_id]
            assert (lease.worker_id, lease.token, lease.retry_count) == (
                worker,
                item.token + 1,
                item.retry_count,
            )
            self.ref.claim(item.id, worker)
            self.granted.append((worker, item.id, lease.token))

    def check_turns(self, got: list[str], n: int, claimable: set[str]) -> None:
        """In a fair queue no key takes more than its share of a claim: with k keys that had
        claimable items (k <= n), at most 2 x ceil(n / k) each (the claim may count more
        keys, whose items are not claimable yet, and so give each a smaller share)."""
        for queue in self.ref.fair_queues:
            keys = {
                self.ref.items[i].fairness_key
                for i in claimable
                if self.ref.items[i].queue == queue and self.ref.items[i].fairness_key
            }
            if not keys or len(keys) > n:
                continue
            taken = Counter(
                self.ref.items[i].fairness_key
                for i in got
                if self.ref.items[i].queue == queue and self.ref.items[i].fairness_key
            )
            share = 2 * -(-n // len(keys))
            assert all(count <= share for count in taken.values()), (taken, share)

    @precondition(lambda self: self.ref.with_status(IN_PROGRESS))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        item = self.draw_item(data, IN_PROGRESS)
        manager, token = self.managers[item.holder], self.token_arg(data, item)
        outcome = manager.release_lease(item.id, True, output_data={"done": item.id}, token=token)
        assert outcome.status == self.ref.complete(item.id)

    @precondition(lambda self: self.ref.with_status(IN_PROGRESS))
    @rule(data=st.data(), retry=st.booleans())
    def fail(self, data: st.DataObject, retry: bool) -> None:
        item = self.draw_item(data, IN_PROGRESS)
        manager, token = self.managers[item.holder], self.token_arg(data, item)
        outcome = manager.release_lease(item.id, False, error="boom", retry=retry, token=token)
        assert outcome.status == self.ref.end_attempt(item.id, retry=retry)
        assert outcome.superseded_by == item.superseded_by

    @precondition(lambda self: self.ref.with_status(IN_PROGRESS))
    @rule(data=st.data(), output=st.sampled_from(UNSTORABLE))
    def return_unstorable_output(self, data: st.DataObject, output: Any) -> None:
        """Refused with a clear error before anything is written; the lease is still held."""
        item = self.draw_item(data, IN_PROGRESS)
        before = db.item_state(item.id)
        with pytest.raises(PayloadNotSerializable):
            self.managers[item.holder].release_lease(
                item.id, True, output_data=output, token=item.token
            )
        assert db.item_state(item.id) == before

    @precondition(lambda self: self.ref.with_status(IN_PROGRESS))
    @rule(data=st.data(), interrupted=st.booleans())
    def hand_back(self, data: st.DataObject, interrupted: bool) -> None:
        """requeue_lease (a worker stopping), or an attempt the database cut short."""
        item = self.draw_item(data, IN_PROGRESS)
        manager = self.managers[item.holder]
        if interrupted:
            outcome = manager.requeue((item.id, item.token), interrupted=True, error="cut short")
        else:
            outcome = manager.requeue_lease(item.id, token=self.token_arg(data, item))
        assert outcome.status == self.ref.hand_back(item.id)
        assert outcome.superseded_by == item.superseded_by

    @precondition(lambda self: self.ref.with_status(IN_PROGRESS))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        """A live lease renews; an expired one is refused and stays as it was."""
        item = self.draw_item(data, IN_PROGRESS)
        manager = self.managers[item.holder]
        if not item.expired:
            assert manager.renew_lease(item.id, token=item.token) is True
            return
        before = db.item_state(item.id)
        with pytest.raises(leasing.LeaseExpiredError):
            manager.renew_lease(item.id, token=item.token)
        assert db.item_state(item.id) == before

    @precondition(lambda self: self.stale_leases())
    @rule(data=st.data(), write=st.sampled_from(["complete", "fail", "requeue", "renew"]))
    def stale_write(self, data: st.DataObject, write: str) -> None:
        """A worker whose lease moved on is refused and changes nothing."""
        worker, item_id, token = data.draw(st.sampled_from(self.stale_leases()), label="lease")
        manager = self.managers[worker]
        before = db.item_state(item_id)
        expected = leasing.WorkItemNotFound if item_id in self.ref.purged else LeaseError
        with pytest.raises(expected):
            if write == "complete":
                manager.release_lease(item_id, True, output_data=1, token=token)
            elif write == "fail":
                manager.release_lease(item_id, False, error="late", retry=True, token=token)
            elif write == "requeue":
                manager.requeue_lease(item_id, token=token)
            else:
                manager.renew_lease(item_id, token=token)
        assert db.item_state(item_id) == before

    # --- time and the sweep ------------------------------------------------------------

    @precondition(lambda self: [i for i in self.ref.with_status(IN_PROGRESS) if not i.expired])
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        live = [i.id for i in self.ref.with_status(IN_PROGRESS) if not i.expired]
        item = self.ref.items[data.draw(st.sampled_from(live), label="item")]
        db.expire_lease(item.id)
        item.expired = True

    @precondition(lambda self: self.ref.with_status(IN_PROGRESS))
    @rule()
    def sweep(self) -> None:
        """One pass recovers every expired lease, in one go, without a failed batch."""
        expired = [i.id for i in self.ref.with_status(IN_PROGRESS) if i.expired]
        stats = self.sweep_pass.scan_and_recover()
        assert stats.errors == 0, f"the sweep pass had {stats.errors} error(s)"
        ended = stats.recovered + stats.failed + stats.cancelled
        assert (stats.expired_found, ended) == (len(expired),) * 2
        after = db.rows()
        asked = [i for i in expired if self.ref.items[i].cancel_requested]
        assert stats.cancelled == len(asked), f"cancelled {stats.cancelled}, asked to stop {asked}"
        left_pending = {i for i in expired if after[i]["status"] == PENDING}
        superseded = {
            i
            for i in expired
            if after[i]["status"] == FAILED
            and (after[i]["error_message"] or "").startswith("Superseded by")
        }
        self.ref.sweep(expired, left_pending, superseded)
        for item_id in expired:
            superseded_by = self.ref.items[item_id].superseded_by
            if superseded_by is not None:
                assert db.superseded_checkpoint(item_id), f"{item_id}: no superseded checkpoint"
        still = [i for i, row in after.items() if row["status"] == IN_PROGRESS and row["expired"]]
        assert not still, f"expired leases left after a sweep pass: {still}"

    @precondition(lambda self: [i for i in self.ref.with_status(PENDING) if not i.ready])
    @rule()
    def let_backoffs_pass(self) -> None:
        db.let_backoffs_pass()
        self.ref.let_backoffs_pass()

    @precondition(lambda self: self.ref.periods_running())
    @rule()
    def end_periods(self) -> None:
        """Period keys' periods end: their items hold them no more, whatever their status."""
        db.end_periods()
        self.ref.end_periods()

    @precondition(lambda self: self.ref.with_status(IN_PROGRESS))
    @rule(data=st.data())
    def forced_stop(self, data: st.DataObject) -> None:
        """A worker's second signal: every run it holds is handed back at once."""
        running = self.ref.with_status(IN_PROGRESS)
        worker = data.draw(st.sampled_from(sorted({i.holder for i in running if i.holder})))
        held = [i.id for i in running if i.holder == worker]
        keys = data.draw(st.permutations([(i, self.ref.items[i].token) for i in held]))
        handed_back = self.managers[worker].requeue_all(keys)
        after = db.rows()
        left_alone = {i for i in held if after[i]["status"] == IN_PROGRESS}
        assert handed_back == len(held) - len(left_alone)
        left_pending = {i for i in held if after[i]["status"] == PENDING}
        self.ref.forced_stop(held, left_alone, left_pending)

    # --- operators ---------------------------------------------------------------------

    @precondition(lambda self: self.ref.items)
    @rule(
        data=st.data(),
        action=st.sampled_from(
            ["force_release", "force_fail", "retry", "cancel", "delete", "run_now"]
        ),
        token=st.sampled_from(["current", "unchecked", "stale"]),
    )
    def operator_action(self, data: st.DataObject, action: str, token: str) -> None:
        item = self.draw_item(data, *STATUSES)
        expected_token = {"current": item.token, "unchecked": None, "stale": item.token + 1}[token]
        self.operate(action, item, expected_token)

    @precondition(lambda self: self.ref.with_status(IN_PROGRESS))
    @rule(
        data=st.data(),
        action=st.sampled_from(["cancel", "force_release", "force_fail"]),
        checked=st.booleans(),
    )
    def operator_action_on_running(self, data: st.DataObject, action: str, checked: bool) -> None:
        """The actions on a running item, often enough that one asked to stop (a cancel)
        is then force-released or force-failed."""
        item = self.draw_item(data, IN_PROGRESS)
        self.operate(action, item, item.token if checked else None)

    def operate(self, action: str, item: Any, expected_token: int | None) -> None:
        holder = self.ref.key_holder(item.key)
        result = leasing.apply_action(
            action, item.id, expected_token=expected_token, actor="model", reason="model step"
        )
        skipped = self.ref.operator(action, item.id, expected_token)
        event(f"operator {action}: {skipped or 'applied'}")
        assert result.applied == (skipped is None), (skipped, result)
        if skipped is None:
            assert result.new_status == item.status, result
        # Only a force-release can supersede; a deleted item that was superseded before
        # is reported deleted.
        if action == "force_release" and skipped is None:
            if item.superseded_by is not None:
                assert f"superseded by {item.superseded_by}" in result.detail, result.detail
            else:
                assert "superseded" not in result.detail, result.detail
            asked = "ended cancelled: it was asked to stop" in result.detail
            assert asked == (item.status == CANCELLED), result.detail
            if asked:
                event("operator force_release: asked to stop, cancelled")
        if skipped == "key":
            assert holder is not None and holder.id in result.detail, result.detail
        if action == "delete" and skipped is None:
            assert db.item_state(item.id) == (None, 0), "a deleted item left its row or checkpoints"
            assert db.deletion_recorded(item.id), "the deletion left no audit checkpoint"

    @precondition(lambda self: [i for i in self.ref.with_status(PENDING) if not i.ready])
    @rule(data=st.data(), stale=st.booleans())
    def run_now(self, data: st.DataObject, stale: bool) -> None:
        """A deferred item made due now: claimable at once unless paused or waiting for
        dependencies; a stale token changes nothing."""
        deferred = [i.id for i in self.ref.with_status(PENDING) if not i.ready]
        item = self.ref.items[data.draw(st.sampled_from(deferred), label="item")]
        expected_token = item.token + 1 if stale else item.token
        result = leasing.apply_action(
            "run_now", item.id, expected_token=expected_token, actor="model", reason="model step"
        )
        skipped = self.ref.operator("run_now", item.id, expected_token)
        event(f"run_now: {skipped or 'applied'}")
        assert result.applied == (skipped is None), (skipped, result)
        assert db.rows()[item.id]["ready"] == (0 if stale else 1)

    @precondition(lambda self: self.ref.with_status(PENDING))
    @rule(
        what=st.sampled_from([("queue", QUEUES[1]), ("work_type", TYPES[1])]),
        paused=st.booleans(),
    )
    def pause_or_resume(self, what: tuple[str, str], paused: bool) -> None:
        """Pauses of q2 and model.b (q1 and model.a keep flowing)."""
        kind, name = what
        call = leasing.pause if paused else leasing.resume
        state = call(**{kind: name}, by="model", reason="model step")
        assert (state.paused, state.changed) == (paused, self.ref.pause(kind, name, paused))

    @precondition(lambda self: self.ref.with_status(COMPLETED, FAILED, CANCELLED))
    @rule(
        statuses=st.sampled_from(
            [(COMPLETED,), (FAILED,), (CANCELLED,), (COMPLETED, FAILED, CANCELLED)]
        )
    )
    def purge(self, statuses: tuple[str, ...]) -> None:
        db.age_finished()
        stats = purge_finished_items(timedelta(hours=1), statuses=statuses)
        assert stats.items_deleted == len(self.ref.purge(statuses))
