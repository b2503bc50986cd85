"""How a worker runs: the options as given, and the configuration resolved from them once.

`runworker` fills `WorkerOptions` from its flags (what differs from one
worker process to the next); everything else is a LEASING setting, which an
embedding program or a test may override here (None means "the setting").
`resolve()` validates every number once and builds the `WorkerConfig` the
runtime uses: the handlers it serves, the lease terms of each work type, the
claim filters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .. import validation
from ..conf import MAX_PREFETCH, WRITE_DATABASE, LeasingSettings, get_settings
from ..exceptions import InvalidInput, UnknownWorkType
from ..handlers import EXECUTION_MODES, HandlerRegistry, HandlerSpec
from ..handlers import registry as handler_registry
from ..services.processes import new_process_id
from ..sql.terms import ClaimFilters, LeaseTerms


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs, as given. `None` means "the LEASING setting"."""

    concurrency: int = 1
    work_types: tuple[str, ...] = ()  # empty: every type with a handler
    task_id: str | None = None
    queues: tuple[str, ...] = ()  # empty: every queue
    lease_seconds: float | None = None
    heartbeat_interval: float | None = None
    poll_interval: float | None = None
    max_items: int | None = None
    burst: bool = False
    worker_id: str | None = None
    shutdown_timeout: float | None = None
    # Claimed-but-unstarted items beyond `concurrency` (LEASING["PREFETCH"]).
    prefetch: int | None = None
    # Seconds between the summary lines the worker logs.
    summary_interval: float = 60.0
    listen: bool = True
    using: str = "default"
    # How handlers of types that do not choose (a handler's `execution`) run:
    # "thread" or "process" (`runworker --execution`).
    execution: str = "thread"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """A worker's configuration, validated and resolved against the settings."""

    worker_id: str
    using: str
    concurrency: int
    prefetch: int | None
    poll_interval: float
    shutdown_timeout: float
    summary_interval: float
    max_items: int | None
    burst: bool
    specs: Mapping[str, HandlerSpec]
    terms: LeaseTerms
    filters: ClaimFilters
    heartbeat_intervals: Mapping[str, float]
    renew_interval: float
    heartbeat_max_failures: int
    extender_interval: float
    listen_database: str | None  # None: poll only
    # Work type -> "thread" or "process": where its handler runs.
    executions: Mapping[str, str]
    process_max_items: int
    process_max_memory_mb: int
    process_stop_grace: float
    # The id was given (--worker-id), so an earlier process may have used it; a
    # generated one (host:pid:random) is new.
    id_given: bool = False

    @property
    def heartbeat_interval(self) -> float:
        """The process's own beat interval (its `workers` row says so)."""
        return self.renew_interval


def resolve(
    options: WorkerOptions,
    handlers: HandlerRegistry = handler_registry,
    conf: LeasingSettings | None = None,
) -> WorkerConfig:
    """Validate the options against the settings and the registered handlers."""
    conf = conf or get_settings()
    using = validation.database_alias(options.using)
    default_lease = validation.positive_seconds(
        "lease_seconds",
        conf.lease_duration if options.lease_seconds is None else options.lease_seconds,
    )
    default_interval = validation.positive_seconds(
        "heartbeat_interval",
        conf.heartbeat_interval
        if options.heartbeat_interval is None
        else options.heartbeat_interval,
    )
    specs = _specs(options.work_types, handlers)
    durations = {t: s.lease_duration or default_lease for t, s in specs.items()}
    intervals = {t: s.heartbeat_interval or default_interval for t, s in specs.items()}
    for work_type in specs:
        validation.heartbeat_below_lease(intervals[work_type], durations[work_type])
    caps = {t: s.cap_seconds(conf.max_lease_lifetime) for t, s in specs.items()}
    task_id = options.task_id
    queues = tuple(validation.non_empty_text("queue", q) for q in options.queues)
    if options.execution not in EXECUTION_MODES:
        raise InvalidInput(f"execution must be 'thread' or 'process', got {options.execution!r}.")
    executions = {t: s.execution or options.execution for t, s in specs.items()}
    listen_database = None
    if options.listen and conf.listen:
        # LISTEN_DATABASE is a direct connection to the default database (behind a
        # pooler): a worker of another alias listens on its own.
        listen_database = (conf.listen_database if using == WRITE_DATABASE else None) or using
    return WorkerConfig(
        worker_id=(
            validation.non_empty_text("worker_id", options.worker_id)
            if options.worker_id
            else new_process_id()
        ),
        using=using,
        concurrency=validation.integer(
            "concurrency", options.concurrency, minimum=1, maximum=10_000
        ),
        prefetch=(
            conf.prefetch
            if options.prefetch is None
            else validation.integer("prefetch", options.prefetch, minimum=0, maximum=MAX_PREFETCH)
        ),
        poll_interval=validation.positive_seconds(
            "poll_interval",
            conf.poll_interval if options.poll_interval is None else options.poll_interval,
        ),
        shutdown_timeout=validation.positive_seconds(
            "shutdown_timeout",
            conf.shutdown_timeout if options.shutdown_timeout is None else options.shutdown_timeout,
        ),
        summary_interval=validation.positive_seconds("summary_interval", options.summary_interval),
        max_items=(
            None
            if options.max_items is None
            else validation.integer("max_items", options.max_items, minimum=1)
        ),
        burst=bool(options.burst),
        specs=MappingProxyType(specs),
        terms=LeaseTerms(
            duration=default_lease,
            cap=conf.max_lease_lifetime,
            durations={t: s for t, s in durations.items() if s != default_lease},
            caps={t: s for t, s in caps.items() if s != conf.max_lease_lifetime},
        ),
        filters=ClaimFilters(
            work_types=tuple(sorted(specs)),
            queues=queues or None,
            task_ids=None if task_id is None else (validation.non_empty_text("task_id", task_id),),
        ),
        heartbeat_intervals=MappingProxyType(intervals),
        renew_interval=min(intervals.values()),
        heartbeat_max_failures=conf.heartbeat_max_failures,
        extender_interval=conf.extender_interval,
        listen_database=listen_database,
        executions=MappingProxyType(executions),
        process_max_items=conf.process_max_items,
        process_max_memory_mb=conf.process_max_memory_mb,
        process_stop_grace=conf.process_stop_grace,
        id_given=bool(options.worker_id),
    )


def _specs(work_types: tuple[str, ...], handlers: HandlerRegistry) -> dict[str, HandlerSpec]:
    if work_types:
        specs = {}
        for work_type in work_types:
            validation.non_empty_text("work_type", work_type)
            specs[work_type] = handlers.get(work_type)
        return specs
    specs = {spec.work_type: spec for spec in handlers.specs()}
    if not specs:
        raise UnknownWorkType(
            "No handlers are registered, so this worker could run nothing. Register one with "
            "@leasing.handler in an app's handlers.py or in LEASING['HANDLERS']."
        )
    return specs
