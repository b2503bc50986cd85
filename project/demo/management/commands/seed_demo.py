"""`python manage.py seed_demo [--fresh] [--scenario PATH]`: load the demo data set.

The scenario (`fixtures/demo.json` by default) describes tasks, work items in
every status, checkpoints of every type, workers, a recovery sweep and
idempotency keys, with every time given as an offset in seconds from "now".
It is materialised relative to the database clock, through the services
where they apply: items are enqueued with `enqueue_many`, claimed, retried,
completed and failed by a `LeaseManager` (so tokens and retry counts are what
real runs leave), live checkpoints are written with `create_checkpoint` under
the lease, and the operator action goes through `leasing.operations`. Only
the past is crafted directly: UPDATEs move timestamps back in time, and
checkpoints that happened in the past are INSERTed with their time (the
service stamps "now", and checkpoints cannot be updated afterwards).

Everything runs in one transaction: a bad scenario fails with a one-line
error and leaves the database as it was.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.test.utils import override_settings

from leasing import Lease, LeaseManager, enqueue_many
from leasing.exceptions import LeasingError
from leasing.ids import new_ulid
from leasing.models import (
    CheckpointType,
    IdempotencyKey,
    IdempotencyStatus,
    Worker,
    WorkerRole,
    WorkerStatus,
    WorkItem,
    WorkItemStatus,
)
from leasing.services import processes
from leasing.services.checkpoints import create_checkpoint, lock_task_sequences
from leasing.services.operations import Action, apply_action
from leasing.sql import checkpoints as checkpoints_sql
from leasing.sql.dialect import Dialect
from leasing.sql.runner import database_now, dump_json, run

DEFAULT_SCENARIO = Path(settings.BASE_DIR) / "fixtures" / "demo.json"
ITEM_STATUSES = tuple(WorkItemStatus.values)
# Leasing tables, children first (checkpoints and keys reference work items).
TABLES = ("checkpoints", "idempotency_keys", "work_items", "workers")


class ScenarioError(CommandError):
    """The scenario file is missing, not JSON, or describes something impossible."""


@dataclass
class Summary:
    """What a seed run created."""

    items: Counter[str] = field(default_factory=Counter)
    checkpoints: Counter[str] = field(default_factory=Counter)
    processes: Counter[str] = field(default_factory=Counter)
    idempotency_keys: int = 0
    operator_actions: int = 0

    def lines(self) -> list[str]:
        def fmt(counter: Counter[str]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "none"

        return [
            f"work items: {sum(self.items.values())} ({fmt(self.items)})",
            f"checkpoints: {sum(self.checkpoints.values())} ({fmt(self.checkpoints)})",
            f"workers table: {fmt(self.processes)}",
            f"idempotency keys: {self.idempotency_keys}, operator actions: {self.operator_actions}",
        ]


def load_scenario(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"Scenario file not found: {path}") from None
    try:
        scenario = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(scenario, dict):
        raise ScenarioError(f"{path}: the scenario must be a JSON object.")
    return scenario


def wipe(using: str = DEFAULT_DB_ALIAS) -> None:
    """Delete every row of the leasing tables (raw DELETEs: checkpoints refuse ORM deletes)."""
    with connections[using].cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"DELETE FROM {table}")


def seed(
    scenario: dict[str, Any], *, fresh: bool = False, using: str = DEFAULT_DB_ALIAS
) -> Summary:
    """Materialise `scenario` relative to the database clock, in one transaction.

    The data set shows work types no handler of this site serves (as a real
    site's producers enqueue work for other services), so it enqueues them
    as a producer-only process would.
    """
    producer = {**getattr(settings, "LEASING", {}), "ALLOW_UNREGISTERED_TYPES": True}
    try:
        with override_settings(LEASING=producer), transaction.atomic(using=using):
            if fresh:
                wipe(using)
            elif (
                WorkItem.objects.using(using).filter(task_id__startswith="demo-").exists()
                or Worker.objects.using(using).filter(worker_id__startswith="demo-").exists()
            ):
                raise ScenarioError(
                    "Demo data is already loaded; run `seed_demo --fresh` to replace it."
                )
            return _Seeder(scenario, using).run()
    except LeasingError as exc:
        raise ScenarioError(f"The scenario was refused by the services: {exc}") from exc


class _Seeder:
    def __init__(self, scenario: dict[str, Any], using: str) -> None:
        self.scenario = scenario
        self.using = using
        self.now = database_now(using)
        self.summary = Summary()
        self.item_ids: dict[tuple[str, str], str] = {}
        self.leases: dict[tuple[str, str], Lease] = {}

    def at(self, offset: Any, what: str) -> datetime:
        if isinstance(offset, bool) or not isinstance(offset, int | float):
            raise ScenarioError(f"{what}: time offsets are numbers of seconds, got {offset!r}.")
        return self.now + timedelta(seconds=offset)

    def run(self) -> Summary:
        for spec in _list(self.scenario, "workers"):
            self._process(spec, WorkerRole.WORKER)
        for spec in _list(self.scenario, "sweepers"):
            self._process(spec, WorkerRole.SWEEPER)
        for task in _list(self.scenario, "tasks"):
            self._task(task)
        for index, bulk in enumerate(_list(self.scenario, "bulk")):
            self._bulk(bulk, index)
        for spec in _list(self.scenario, "idempotency_keys"):
            self._idempotency_key(spec)
        return self.summary

    # --- the workers table -----------------------------------------------------------------

    def _process(self, spec: dict[str, Any], role: str) -> None:
        worker_id = _text(spec, "worker_id", "worker")
        where = f"{role} {worker_id!r}"
        status = spec.get("status", WorkerStatus.RUNNING)
        if status not in WorkerStatus.values:
            raise ScenarioError(
                f"{where}: unknown status {status!r}; expected one of "
                f"{', '.join(WorkerStatus.values)}."
            )
        processes.register(
            worker_id,
            role,
            heartbeat_interval=float(spec.get("heartbeat_interval", 30)),
            concurrency=int(spec.get("concurrency", 1)),
            work_types=spec.get("work_types", []),
            queues=spec.get("queues", []),
            using=self.using,
        )
        fields: dict[str, Any] = {
            "hostname": spec.get("hostname", "demo-host"),
            "pid": int(spec.get("pid", 1)),
            "status": status,
            "started_at": self.at(spec.get("started", -3600), where),
            "last_seen_at": self.at(spec.get("last_seen", 0), where),
            "items_completed": int(spec.get("items_completed", 0)),
            "items_failed": int(spec.get("items_failed", 0)),
            "scans": int(spec.get("scans", 0)),
            "items_recovered": int(spec.get("items_recovered", 0)),
        }
        if "stopped" in spec:
            fields["stopped_at"] = self.at(spec["stopped"], where)
        if "last_scan" in spec:
            fields["last_scan_at"] = self.at(spec["last_scan"], where)
            fields["last_scan_stats"] = spec.get("last_scan_stats")
        Worker.objects.using(self.using).filter(pk=worker_id).update(**fields)
        self.summary.processes[f"{role} {status}"] += 1

    # --- tasks ------------------------------------------------------------------------------

    def _task(self, task: dict[str, Any]) -> None:
        task_id = _text(task, "task_id", "task")
        items = _list(task, "items", f"task {task_id!r}")
        for spec in items:
            status = spec.get("status")
            if status not in ITEM_STATUSES:
                raise ScenarioError(
                    f"task {task_id!r}, item {spec.get('key')!r}: unknown status {status!r}; "
                    f"expected one of {', '.join(ITEM_STATUSES)}."
                )
        # Items that are claimed go first, one at a time, so that a claim
        # filtered by task always takes the item just enqueued; plain pending
        # items are enqueued last.
        claimed = [s for s in items if s["status"] != WorkItemStatus.PENDING or s.get("retries")]
        waiting = [s for s in items if s not in claimed]
        for spec in claimed:
            self._claimed_item(task, spec)
        if waiting:
            created = enqueue_many([self._enqueue_spec(task, s) for s in waiting], using=self.using)
            for spec, item in zip(waiting, created, strict=True):
                self.item_ids[(task_id, spec["key"])] = item.pk
                self._backdate_pending(task_id, spec, item.pk)
        self._checkpoints(task_id, _list(task, "checkpoints", f"task {task_id!r}"))
        for spec in _list(task, "live_checkpoints", f"task {task_id!r}"):
            self._live_checkpoint(task_id, spec)
        if task.get("operator"):
            self._operator(task_id, task["operator"])

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

    def _claimed_item(self, task: dict[str, Any], spec: dict[str, Any]) -> None:
        task_id, key = task["task_id"], _text(spec, "key", f"task {task['task_id']!r} item")
        where = f"task {task_id!r}, item {key!r}"
        status = spec["status"]
        holder = spec.get("holder", "demo-worker")
        retries = int(spec.get("retries", 0))
        [item] = enqueue_many([self._enqueue_spec(task, spec)], using=self.using)
        self.item_ids[(task_id, key)] = item.pk
        if retries > item.max_retries:
            raise ScenarioError(
                f"{where}: {retries} retries exceed max_retries {item.max_retries}."
            )
        manager = LeaseManager(holder, using=self.using)
        for attempt in range(retries):
            self._claim(manager, task_id, key, item.pk)
            manager.release_lease(
                item.pk, False, error=f"demo failure on attempt {attempt + 1}", retry=True
            )
            # Skip the backoff: the next attempt happens now, its time is set below.
            WorkItem.objects.using(self.using).filter(pk=item.pk).update(run_after=None)

        updates: dict[str, Any] = {"created_at": self.at(spec.get("created", -60), where)}
        if status == WorkItemStatus.PENDING:
            updates["run_after"] = self.at(spec.get("run_after", 0), where)
            updates["error_message"] = spec.get("error")
            updates["updated_at"] = self.now
        elif status == WorkItemStatus.IN_PROGRESS:
            lease_spec = spec.get("lease") or {}
            acquired = self.at(lease_spec.get("acquired", -30), where)
            expires = self.at(lease_spec.get("expires", 270), where)
            lease = self._claim(manager, task_id, key, item.pk)
            self.leases[(task_id, key)] = lease
            updates.update(
                started_at=acquired,
                lease_acquired_at=acquired,
                lease_expires_at=expires,
                heartbeat_at=self.at(lease_spec.get("heartbeat", 0), where),
                progress_at=self.at(lease_spec["progress"], where)
                if "progress" in lease_spec
                else None,
                updated_at=self.now,
            )
        else:
            finished = self.at(spec.get("finished", -10), where)
            started = self.at(spec.get("started", spec.get("finished", -10) - 5), where)
            self._claim(manager, task_id, key, item.pk)
            if status == WorkItemStatus.COMPLETED:
                manager.release_lease(item.pk, True, output_data=spec.get("output"))
            else:
                manager.release_lease(item.pk, False, error=spec.get("error", "demo failure"))
            updates.update(
                started_at=started,
                lease_acquired_at=started,
                heartbeat_at=finished,
                completed_at=finished,
                updated_at=finished,
            )
        WorkItem.objects.using(self.using).filter(pk=item.pk).update(**updates)
        self.summary.items[status] += 1

    def _backdate_pending(self, task_id: str, spec: dict[str, Any], item_id: str) -> None:
        where = f"task {task_id!r}, item {spec['key']!r}"
        updates: dict[str, Any] = {"created_at": self.at(spec.get("created", -30), where)}
        if "run_after" in spec:
            updates["run_after"] = self.at(spec["run_after"], where)
        WorkItem.objects.using(self.using).filter(pk=item_id).update(**updates)
        self.summary.items[WorkItemStatus.PENDING] += 1

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
            Dialect(self.using),
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
        action = {"retry": Action.RETRY, "force_release": Action.FORCE_RELEASE}.get(
            spec.get("action"), spec.get("action")
        )
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
        prefix = _text(spec, "task_prefix", where)
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

        key = _text(spec, "key", "idempotency key")
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


def _list(container: dict[str, Any], name: str, where: str = "scenario") -> list[dict[str, Any]]:
    value = container.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ScenarioError(f"{where}: {name!r} must be a list of objects.")
    return value


def _text(container: dict[str, Any], name: str, where: str) -> str:
    value = container.get(name)
    if not isinstance(value, str) or not value:
        raise ScenarioError(f"{where}: {name!r} must be a non-empty string, got {value!r}.")
    return value


class Command(BaseCommand):
    help = (
        "Load the demo data set (fixtures/demo.json): work items in every status, checkpoints "
        "of every type, workers and a recovery sweep, relative to the database clock."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--fresh",
            action="store_true",
            help="Delete every row of the leasing tables (work items, checkpoints, "
            "idempotency keys, workers) first.",
        )
        parser.add_argument(
            "--scenario",
            default=str(DEFAULT_SCENARIO),
            help=f"Scenario file (default: {DEFAULT_SCENARIO}).",
        )
        parser.add_argument(
            "--database", default=DEFAULT_DB_ALIAS, help="Database alias (default: 'default')."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        scenario = load_scenario(options["scenario"])
        summary = seed(scenario, fresh=options["fresh"], using=options["database"])
        self.stdout.write(
            self.style.SUCCESS(f"Loaded the demo data set from {options['scenario']}:")
        )
        for line in summary.lines():
            self.stdout.write(f"  {line}")
