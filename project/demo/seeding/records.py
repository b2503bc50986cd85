"""The seeder's base: its clock, claims and enqueue specs, and what it writes besides items.

`Seeder` builds the workers, tasks and items on it; this half writes
checkpoints (past and live), the operator action, bulk finished history and
idempotency keys, and counts each in `summary`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from leasing import Lease, LeaseManager, enqueue_many
from leasing.ids import new_ulid
from leasing.models import (
    CheckpointType,
    IdempotencyKey,
    IdempotencyStatus,
    WorkItem,
    WorkItemStatus,
)
from leasing.services.checkpoints import create_checkpoint, lock_task_sequences
from leasing.services.operations import Action, apply_action
from leasing.sql import checkpoints as checkpoints_sql
from leasing.sql.runner import dump_json, run
from leasing.storage import storage_for

from .scenario import ScenarioError, Summary, text


class Records:
    """Offsets from the database clock, claims, and the records beside the items."""

    using: str
    now: datetime
    summary: Summary
    item_ids: dict[tuple[str, str], str]
    leases: dict[tuple[str, str], Lease]

    def at(self, offset: Any, what: str) -> datetime:
        if isinstance(offset, bool) or not isinstance(offset, int | float):
            raise ScenarioError(f"{what}: time offsets are numbers of seconds, got {offset!r}.")
        return self.now + timedelta(seconds=offset)

    def _enqueue_spec(self, task: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "task_id": task["task_id"],
            "work_type": spec.get("work_type", task.get("work_type", "demo")),
            "input_data": spec.get("input"),
            "priority": int(spec.get("priority", 0)),
            "max_retries": int(spec.get("max_retries", task.get("max_retries", 3))),
            "queue_name": spec.get("queue", task.get("queue", "default")),
        }

    def _claim(self, manager: LeaseManager, task_id: str, key: str, item_id: str) -> Lease:
        lease = manager.acquire_lease(lease_duration_seconds=300, task_id_filter=task_id)
        if lease is None or lease.work_item_id != item_id:
            raise ScenarioError(
                f"task {task_id!r}, item {key!r}: could not claim it for {manager.worker_id!r} "
                "(another pending item of the task is claimable)."
            )
        return lease

    # --- checkpoints --------------------------------------------------------------------------

    def _item_id(self, task_id: str, key: Any, where: str) -> str | None:
        if key is None:
            return None
        try:
            return self.item_ids[(task_id, key)]
        except KeyError:
            raise ScenarioError(f"{where}: no item {key!r} in task {task_id!r}.") from None

    def _checkpoints(self, task_id: str, specs: Iterable[dict[str, Any]]) -> None:
        """Past checkpoints, in time order, with the time they happened."""
        where = f"task {task_id!r} checkpoint"
        ordered = sorted(specs, key=lambda s: s.get("at", 0))
        for spec in ordered:
            self._insert_checkpoint(
                task_id,
                CheckpointType.validate(spec.get("type")),
                spec.get("snapshot", {}),
                self._item_id(task_id, spec.get("item"), where),
                spec.get("metadata"),
                self.at(spec.get("at", 0), where),
            )

    def _insert_checkpoint(
        self,
        task_id: str,
        checkpoint_type: str,
        snapshot: Any,
        item_id: str | None,
        metadata: Any,
        created_at: datetime,
    ) -> None:
        """The INSERT of `create_checkpoint()`, with a past `created_at`."""
        lock_task_sequences(self.using, [task_id])
        statement = checkpoints_sql.append(
            storage_for(self.using),
            checkpoint_id=new_ulid(),
            task_id=task_id,
            item_id=item_id,
            checkpoint_type=checkpoint_type,
            snapshot_json=dump_json(snapshot) or "{}",
            metadata_json=dump_json(metadata),
            created_at=created_at,
        )
        run(self.using, statement)
        self.summary.checkpoints[checkpoint_type] += 1

    def _live_checkpoint(self, task_id: str, spec: dict[str, Any]) -> None:
        """A checkpoint written now, fenced by the item's lease (the real service)."""
        key = spec.get("item")
        lease = self.leases.get((task_id, key))
        if lease is None:
            raise ScenarioError(
                f"task {task_id!r}: live checkpoints need an in-progress item, not {key!r}."
            )
        checkpoint = create_checkpoint(
            task_id,
            spec.get("type"),
            spec.get("snapshot", {}),
            metadata=spec.get("metadata"),
            lease=lease,
            using=self.using,
        )
        self.summary.checkpoints[checkpoint.checkpoint_type] += 1

    def _operator(self, task_id: str, spec: dict[str, Any]) -> None:
        where = f"task {task_id!r} operator action"
        action = {
            "retry": Action.RETRY,
            "force_release": Action.FORCE_RELEASE,
            "cancel": Action.CANCEL,
        }.get(spec.get("action"), spec.get("action"))
        item_id = self._item_id(task_id, spec.get("item"), where)
        token = (
            WorkItem.objects.using(self.using).values_list("lease_token", flat=True).get(pk=item_id)
        )
        result = apply_action(
            action,
            item_id,
            expected_token=token,
            actor=spec.get("actor", "demo-operator"),
            reason=spec.get("reason", "demo"),
            using=self.using,
        )
        if not result.applied:
            raise ScenarioError(f"{where}: {result.detail}")
        self.summary.operator_actions += 1
        self.summary.checkpoints[CheckpointType.STATE_TRANSITION] += 1
        self.summary.items[result.old_status] -= 1
        self.summary.items[result.new_status] += 1

    # --- many similar finished items (the charts) ----------------------------------------------

    def _bulk(self, spec: dict[str, Any], index: int) -> None:
        where = f"bulk #{index}"
        count = int(spec.get("count", 0))
        prefix = text(spec, "task_prefix", where)
        holders = spec.get("holders") or ["demo-worker"]
        rng = random.Random(spec.get("seed", index))
        low, high = spec.get("finished_between", [-3600, 0])
        run_low, run_high = spec.get("run_seconds", [1, 10])
        weights = spec.get("retry_weights", [1])
        fail_every = int(spec.get("fail_every", 0))
        max_retries = int(spec.get("max_retries", 3))
        task = {
            "work_type": spec.get("work_type", "demo"),
            "queue": spec.get("queue", "default"),
            "max_retries": max_retries,
        }
        specs = [
            {"task_id": f"{prefix}-{n:04d}", "key": "item", "input": {"n": n}} for n in range(count)
        ]
        items = enqueue_many(
            [self._enqueue_spec({**task, "task_id": s["task_id"]}, s) for s in specs],
            using=self.using,
        )
        for n, (spec_n, item) in enumerate(zip(specs, items, strict=True)):
            task_id = spec_n["task_id"]
            holder = holders[n % len(holders)]
            manager = LeaseManager(holder, using=self.using)
            fails = fail_every > 0 and n % fail_every == fail_every - 1
            retries = max_retries if fails else rng.choices(range(len(weights)), weights)[0]
            finished = rng.uniform(low, high)
            started = finished - rng.uniform(run_low, run_high)
            for attempt in range(retries):
                self._claim(manager, task_id, "item", item.pk)
                manager.release_lease(item.pk, False, error="demo: lease expired", retry=True)
                WorkItem.objects.using(self.using).filter(pk=item.pk).update(run_after=None)
                self._insert_checkpoint(
                    task_id,
                    CheckpointType.ERROR_BOUNDARY,
                    {
                        "error": f"Lease expired - retry {attempt + 1}/{max_retries}",
                        "retry_count": attempt + 1,
                        "max_retries": max_retries,
                    },
                    item.pk,
                    {"source": "recovery_sweep"},
                    self.at(started - (retries - attempt) * 20, where),
                )
            self._claim(manager, task_id, "item", item.pk)
            if fails:
                manager.release_lease(item.pk, False, error="Max retries exceeded")
                status = WorkItemStatus.FAILED
            else:
                manager.release_lease(item.pk, True, output_data={"ok": True, "n": n})
                status = WorkItemStatus.COMPLETED
            WorkItem.objects.using(self.using).filter(pk=item.pk).update(
                created_at=self.at(started - rng.uniform(1, 30) - retries * 60, where),
                started_at=self.at(started, where),
                lease_acquired_at=self.at(started, where),
                heartbeat_at=self.at(finished, where),
                completed_at=self.at(finished, where),
                updated_at=self.at(finished, where),
            )
            self.summary.items[status] += 1

    # --- idempotency keys -----------------------------------------------------------------------

    def _idempotency_key(self, spec: dict[str, Any]) -> None:
        from leasing.services.idempotency import request_hash

        key = text(spec, "key", "idempotency key")
        where = f"idempotency key {key!r}"
        status = spec.get("status", IdempotencyStatus.PENDING)
        if status not in IdempotencyStatus.values:
            raise ScenarioError(f"{where}: unknown status {status!r}.")
        item = spec.get("item")
        item_id = self._item_id(item[0], item[1], where) if item else None
        IdempotencyKey.objects.using(self.using).create(
            idempotency_key=key,
            task_id=spec.get("task"),
            work_item_id=item_id,
            request_hash=request_hash(spec.get("request", {})),
            response_data=spec.get("response"),
            status=status,
            created_at=self.at(spec.get("created", 0), where),
            completed_at=self.at(spec["completed"], where) if "completed" in spec else None,
            expires_at=self.at(spec["expires"], where) if "expires" in spec else None,
        )
        self.summary.idempotency_keys += 1
