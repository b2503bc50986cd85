"""The seeder: workers, tasks and their items, claimed and ended through the services."""

from __future__ import annotations

from typing import Any

from leasing import Lease, LeaseManager, enqueue_many
from leasing.models import Worker, WorkerRole, WorkerStatus, WorkItem, WorkItemStatus
from leasing.services import processes
from leasing.sql.runner import database_now

from .records import Records
from .scenario import ITEM_STATUSES, ScenarioError, Summary, object_list, text


class Seeder(Records):
    """Materialises one scenario through the services (see the package's docstring)."""

    def __init__(self, scenario: dict[str, Any], using: str) -> None:
        self.scenario = scenario
        self.using = using
        self.now = database_now(using)
        self.summary = Summary()
        self.item_ids: dict[tuple[str, str], str] = {}
        self.leases: dict[tuple[str, str], Lease] = {}

    def run(self) -> Summary:
        for spec in object_list(self.scenario, "workers"):
            self._process(spec, WorkerRole.WORKER)
        for spec in object_list(self.scenario, "sweepers"):
            self._process(spec, WorkerRole.SWEEPER)
        for task in object_list(self.scenario, "tasks"):
            self._task(task)
        for index, bulk in enumerate(object_list(self.scenario, "bulk")):
            self._bulk(bulk, index)
        for spec in object_list(self.scenario, "idempotency_keys"):
            self._idempotency_key(spec)
        return self.summary

    # --- the workers table -----------------------------------------------------------------

    def _process(self, spec: dict[str, Any], role: str) -> None:
        worker_id = text(spec, "worker_id", "worker")
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
        task_id = text(task, "task_id", "task")
        items = object_list(task, "items", f"task {task_id!r}")
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
        self._checkpoints(task_id, object_list(task, "checkpoints", f"task {task_id!r}"))
        for spec in object_list(task, "live_checkpoints", f"task {task_id!r}"):
            self._live_checkpoint(task_id, spec)
        if task.get("operator"):
            self._operator(task_id, task["operator"])

    def _claimed_item(self, task: dict[str, Any], spec: dict[str, Any]) -> None:
        task_id, key = task["task_id"], text(spec, "key", f"task {task['task_id']!r} item")
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
