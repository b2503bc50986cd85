"""Running handlers in the test's own thread: `run_handler()`, `run_item()`, `drain()`.

Each run goes through the worker's own parts, one item at a time: the claim
(`LeaseManager.claim` with the terms and filters `runworker` would resolve,
so pauses, concurrency limits, priorities and dependencies apply), a
`WorkContext` on the claimed lease (checkpoints, `beat()`, `resume_state()`
and `run_once()` are fenced by it as in production), and the worker's
endings: the batch completion, and the `Recorder` for a failure, a retry with
its backoff, an interruption or a time-out, each with its `error_boundary`
checkpoint.

What differs from a worker process: nothing runs in another thread, so no
renewer keeps a `thread`-mode lease alive (a run lasts its lease duration at
most; `beat`-mode handlers extend theirs as in production), and a run past
its deadline is not cut off but timed out once it returns. Inside a test's
transaction a handler runs in a savepoint (`leasing.testing.transactions`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db.models.functions import Now

from .. import validation
from ..context import WorkContext
from ..heartbeat import LeaseExtender, LeaseExtenderConfig
from ..ids import new_ulid
from ..services.completion import complete
from ..services.enqueue import enqueue
from ..services.held import Lease, ReleaseOutcome
from ..services.leases import LeaseManager
from ..worker import WorkerConfig, WorkerOptions, resolve
from ..worker.outcomes import Counters, Recorder
from ..worker.slots import Slot
from .claims import not_claimable
from .results import COMPLETED, FAILED, HANDED_BACK, LOST, RETRIED, DrainResult, HandlerRun
from .transactions import contained

if TYPE_CHECKING:
    from ..handlers import HandlerSpec
    from ..models import WorkItem

WORKER_ID = "leasing.testing"

# drain() without `max_runs` stops with an error after this many runs: work
# that keeps enqueuing more work would otherwise never end.
DRAIN_SAFETY_LIMIT = 10_000


def run_handler(
    work_type: str,
    input_data: Any = None,
    *,
    task_id: str | None = None,
    queue_name: str = "default",
    priority: int = 0,
    max_retries: int | None = None,
    raise_errors: bool = True,
    worker_id: str = WORKER_ID,
    using: str = "default",
) -> HandlerRun:
    """Enqueue an item for `work_type`'s handler, claim it and run the handler here.

    The item is a real one (on a new task id unless `task_id` is given), so
    the handler's context is a real lease's. Returns the `HandlerRun`; if the
    handler raised, its ending (a retry or a failure) is written first and
    the exception is raised again, unless `raise_errors=False`.
    """
    task_id = task_id or f"test-{new_ulid()}"
    config = _config(
        worker_id, using, work_types=(work_type,), queues=(queue_name,), task_id=task_id
    )
    item = enqueue(
        task_id,
        work_type,
        input_data,
        priority=priority,
        max_retries=max_retries,
        queue_name=queue_name,
        using=using,
    )
    return _run_one(item, config, raise_errors=raise_errors)


def run_item(
    item: WorkItem | str,
    *,
    raise_errors: bool = True,
    worker_id: str = WORKER_ID,
    using: str = "default",
) -> HandlerRun:
    """Claim this enqueued item and run its handler here (see `run_handler()`).

    Raises `NotClaimable` (an `AssertionError`) saying why if a worker could
    not claim it now: not pending, not due yet, waiting on dependencies, paused,
    or another item of its task comes first.
    """
    from ..models import WorkItem

    using = validation.database_alias(using)
    item_id = validation.non_empty_text("item", getattr(item, "work_item_id", item))
    row = WorkItem.objects.using(using).filter(pk=item_id).first()
    if row is None:
        raise not_claimable(item_id, using, missing=True)
    config = _config(
        worker_id,
        using,
        work_types=(row.work_type,),
        queues=(row.queue_name,),
        task_id=row.task_id,
    )
    return _run_one(row, config, raise_errors=raise_errors)


def drain(
    *,
    queue_name: str | Iterable[str] | None = None,
    work_type: str | Iterable[str] | None = None,
    task_id: str | None = None,
    include_scheduled: bool = False,
    retry_now: bool = False,
    max_runs: int | None = None,
    raise_errors: bool = False,
    worker_id: str = WORKER_ID,
    using: str = "default",
) -> DrainResult:
    """Run every claimable item (of these queues, work types, task) here, one at a time.

    Keeps claiming until nothing is claimable: items that dependencies
    release and items handlers enqueue run too. `include_scheduled=True` runs
    items scheduled for later as if they were due; `retry_now=True` makes a
    failed attempt's retry due at once instead of after its backoff (so a
    failing item runs up to `max_retries + 1` times). A handler's exception
    ends its run as a worker would and the drain goes on, unless
    `raise_errors=True`: then it is raised once its ending is written.
    """
    if max_runs is not None:
        max_runs = validation.integer("max_runs", max_runs, minimum=1)
    config = _config(
        worker_id,
        using,
        work_types=_names(work_type),
        queues=_names(queue_name),
        task_id=task_id,
    )
    manager = LeaseManager(config.worker_id, using=config.using)
    recorder = Recorder(manager, Counters(), exiting=lambda: False)
    runs: list[HandlerRun] = []
    while max_runs is None or len(runs) < max_runs:
        if include_scheduled:
            _make_due(config)
        leases = manager.claim(1, config.terms, config.filters)
        if not leases:
            break
        if max_runs is None and len(runs) >= DRAIN_SAFETY_LIMIT:
            manager.requeue(leases[0].key, interrupted=False)
            raise AssertionError(
                f"drain() ran {len(runs)} items and still finds work to claim: does a "
                "handler enqueue more work every time it runs? Pass max_runs= to stop earlier."
            )
        run = _execute(manager, recorder, config, leases[0], raise_errors=raise_errors)
        runs.append(run)
        if retry_now and run.outcome == RETRIED:
            _make_due(config, retried=run.lease)
    return DrainResult(tuple(runs))


# --- one run -------------------------------------------------------------------------


def _config(
    worker_id: str,
    using: str,
    *,
    work_types: tuple[str, ...] = (),
    queues: tuple[str, ...] = (),
    task_id: str | None = None,
) -> WorkerConfig:
    """What `runworker` would resolve for these filters (raises `UnknownWorkType`)."""
    options = WorkerOptions(
        work_types=work_types,
        queues=queues,
        task_id=task_id,
        worker_id=worker_id,
        listen=False,
        using=validation.database_alias(using),
    )
    return resolve(options)


def _names(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _run_one(item: WorkItem, config: WorkerConfig, *, raise_errors: bool) -> HandlerRun:
    """Claim `item` (through the claim filters of its own task) and run it."""
    manager = LeaseManager(config.worker_id, using=config.using)
    leases = manager.claim(1, config.terms, config.filters)
    if not leases:
        raise not_claimable(item.work_item_id, config.using)
    lease = leases[0]
    if lease.work_item_id != item.work_item_id:
        # An earlier item of the same task, type and queue came first: give it back.
        manager.requeue(lease.key, interrupted=False)
        raise not_claimable(item.work_item_id, config.using, first=lease.work_item_id)
    recorder = Recorder(manager, Counters(), exiting=lambda: False)
    return _execute(manager, recorder, config, lease, raise_errors=raise_errors)


def _execute(
    manager: LeaseManager,
    recorder: Recorder,
    config: WorkerConfig,
    lease: Lease,
    *,
    raise_errors: bool,
) -> HandlerRun:
    """Run the handler on a claimed lease and write its ending, as an executor does."""
    spec = config.specs[lease.work_type]
    slot = Slot(lease, spec, config.terms.duration_for(lease.work_type))
    slot.started_at = time.monotonic()
    context = WorkContext(lease, slot.heartbeat, using=config.using)
    slot.context = context
    try:
        with contained(config.using):
            output = _call(spec, slot, context, config)
        output_json = validation.payload("handler output", output)
    except BaseException as exc:  # every exception ends the run, as in an executor
        ending = recorder.failure(slot, exc)
        run = _finished(lease, _outcome(lease, ending), config.using, error=exc)
        if raise_errors or isinstance(exc, KeyboardInterrupt):
            raise
        return run
    if time.monotonic() > slot.deadline():
        # A worker would have cut the run off at its deadline and timed it out.
        ending = recorder.time_out(slot)
        return _finished(lease, _outcome(lease, ending), config.using, output, timed_out=True)
    completion = complete(manager, [(lease, output_json)])
    if completion.unwritten:
        raise RuntimeError(
            f"The completion of {lease.work_item_id} could not be written: the database went away."
        )
    outcome = COMPLETED if completion.completed else FAILED if completion.unstorable else LOST
    return _finished(lease, outcome, config.using, output)


def _call(spec: HandlerSpec, slot: Slot, context: WorkContext, config: WorkerConfig) -> Any:
    """Call the handler; a `beat`-mode one extends its lease when it beats, as in an executor."""
    if spec.heartbeat != "beat":
        return spec.func(context)
    interval = min(
        config.extender_interval,
        config.heartbeat_intervals.get(spec.work_type, slot.lease_duration),
    )
    extender = LeaseExtender(
        LeaseExtenderConfig(
            interval=min(interval, slot.lease_duration / 2), extension=slot.lease_duration
        ),
        using=config.using,
        on_lease_lost=lambda _id, exc: context.mark_lease_lost(str(exc)),
    )
    with extender.attach(slot.lease, slot.heartbeat):
        return spec.func(context)


def _outcome(lease: Lease, ending: ReleaseOutcome | None) -> str:
    if ending is None:
        return LOST
    if ending.superseded_by or not ending.will_retry:
        return FAILED
    if ending.retry_count == lease.retry_count:
        return HANDED_BACK
    return RETRIED


def _finished(
    lease: Lease,
    outcome: str,
    using: str,
    output: Any = None,
    *,
    error: BaseException | None = None,
    timed_out: bool = False,
) -> HandlerRun:
    from ..models import WorkItem

    item = WorkItem.objects.using(using).get(pk=lease.work_item_id)
    return HandlerRun(item, lease, outcome, output, error, timed_out)


def _make_due(config: WorkerConfig, *, retried: Lease | None = None) -> None:
    """Pending items of the drain (or the item this lease's run retried) become due now.

    Fenced by status (and for a retry by the lease's token), so nothing a
    worker holds, finished or claimed since is touched.
    """
    from ..models import WorkItem

    pending = WorkItem.objects.using(config.using).pending().filter(run_after__isnull=False)
    if retried is not None:
        pending = pending.filter(pk=retried.work_item_id, lease_token=retried.token)
    else:
        filters = config.filters
        pending = pending.filter(work_type__in=filters.work_types or ())
        if filters.queues is not None:
            pending = pending.filter(queue_name__in=filters.queues)
        if filters.task_ids is not None:
            pending = pending.filter(task_id__in=filters.task_ids)
    pending.update(run_after=None, updated_at=Now())
