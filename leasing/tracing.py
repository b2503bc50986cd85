"""OpenTelemetry spans for a work item's life, when `LEASING["TRACING"]` is on.

    pip install 'django-leasing[otel]'      # opentelemetry-api; the SDK and exporter are yours
    LEASING = {"TRACING": True}

Spans (the OpenTelemetry messaging conventions; `messaging.system` is "leasing",
the destination is the queue, the message id the work item id):

    span name        kind      messaging.operation.type
    enqueue {queue}  PRODUCER  send      enqueue() / enqueue_many(): one span a batch
    claim {queue}    CLIENT    receive   from the database's claim time to the worker's receipt
    run {queue}      CONSUMER  process   the handler's run (attempt, lease token, work type)
    checkpoint       INTERNAL  -         each create_checkpoint() (ctx.checkpoint())
    run_once         INTERNAL  -         each run_once(), saying whether its function ran
    settle {queue}   CLIENT    settle    the ending: completed, failed, retry or cancelled
                                         (also for a lease the sweep recovered)

The enqueuer's trace context (W3C traceparent and tracestate) is stored with
the item (`WorkItem.trace_context`) in the enqueue's transaction, and the
claim returns it with the lease (`Lease.trace_context`); the run's spans
continue that trace (`TRACING = "link"`: a trace of their own) and link
to it. In process execution mode the child makes the claim and run spans
around the handler (`run_in_child`), and sends the run span's ids to the worker, whose
settle span is its child. Why this differs from River's otelriver: docs/how-to/tracing.md.

Off (the default) or without opentelemetry installed, nothing here imports
opentelemetry, and each hook costs one settings lookup. Nothing here fails
the work it traces: a run whose spans cannot be made runs untraced.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed
from django.db import transaction
from django.dispatch import receiver

from . import signals
from .conf import get_settings

if TYPE_CHECKING:
    from .context import WorkContext
    from .models import WorkItem
    from .services.held import Lease
    from .worker.slots import Slot

logger = logging.getLogger("leasing.tracing")

SYSTEM = "leasing"
# The instrumentation scope: what a backend shows as the spans' library.
SCOPE = "leasing"

# The statuses a release leaves an item in, as the endings the spans name.
ENDINGS = {
    "completed": "completed",
    "failed": "failed",
    "pending": "retry",
    "cancelled": "cancelled",
}

# The traced runs this process remembers (`_runs`).
MAX_RUNS_REMEMBERED = 10_000

# The trace contexts of one enqueue are stored this many items an UPDATE (SQLite's bound
# parameters).
STORE_CHUNK = 5000


class _Api:
    """The opentelemetry-api modules, imported on first use when tracing is on."""

    def __init__(self) -> None:
        from opentelemetry import context, propagate, trace

        self.context = context
        self.propagate = propagate
        self.trace = trace
        self.tracer = trace.get_tracer(SCOPE)


_api: _Api | None = None
_api_missing = False
_api_lock = threading.Lock()


def installed() -> bool:
    """Whether opentelemetry-api can be imported (importing at most its namespace package)."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except ImportError:
        return False


def _loaded() -> _Api | None:
    global _api, _api_missing
    if _api is not None or _api_missing:
        return _api
    with _api_lock:
        if _api is None and not _api_missing:
            try:
                _api = _Api()
            except ImportError:
                # leasing.W010 says so; the work goes on untraced.
                logger.warning("LEASING['TRACING'] is on but opentelemetry-api is not installed")
                _api_missing = True
    return _api


def enabled() -> bool:
    """Tracing is on and opentelemetry-api is importable."""
    return bool(get_settings().tracing) and _loaded() is not None


def _api_or_fail() -> _Api:
    api = _loaded()
    assert api is not None  # callers checked enabled()
    return api


def _base(queue: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"messaging.system": SYSTEM}
    if queue is not None:
        attributes["messaging.destination.name"] = queue
    return attributes


def _name(operation: str, queue: str | None) -> str:
    return operation if queue is None else f"{operation} {queue}"


# --- enqueue ---------------------------------------------------------------------------------


def enqueue(
    using: str,
    specs: list[Any],
    insert: Callable[[str, list[Any]], list[WorkItem]],
) -> list[WorkItem]:
    """`insert(using, specs)` under a producer span, storing its context with the new items.

    The items and their trace context are written in one transaction, so a
    worker never claims an item before its trace context is there. The context
    is one UPDATE after the insert rather than a column of it: every insert
    path (the bulk INSERT, the COPY, unique keys and dependencies) stays as it
    is, and untraced enqueues pay nothing.
    """
    api = _api_or_fail()
    # The batch's queue when it has one; the specs are not validated yet (`insert` does it).
    names = [
        spec.get("queue_name", "default") if isinstance(spec, Mapping) else None for spec in specs
    ]
    first = names[0]
    queue = first if isinstance(first, str) and all(name == first for name in names) else None
    attributes = _base(queue)
    attributes["messaging.operation.type"] = "send"
    attributes["messaging.operation.name"] = "enqueue"
    if len(specs) > 1:
        attributes["messaging.batch.message_count"] = len(specs)
    kind = api.trace.SpanKind.PRODUCER
    with api.tracer.start_as_current_span(
        _name("enqueue", queue), kind=kind, attributes=attributes
    ):
        carrier: dict[str, str] = {}
        api.propagate.inject(carrier)
        with transaction.atomic(using=using):
            items = insert(using, specs)
            new = [item for item in items if not item.duplicate]
            if carrier:
                _store(using, [item.work_item_id for item in new], carrier)
        if len(items) == 1:
            span = api.trace.get_current_span()
            span.set_attribute("messaging.message.id", items[0].work_item_id)
            if items[0].duplicate:
                span.set_attribute("leasing.duplicate", True)
    if carrier:
        for item in new:
            item.trace_context = carrier
    return items


def _store(using: str, ids: list[str], carrier: dict[str, str]) -> None:
    from .models import WorkItem

    for start in range(0, len(ids), STORE_CHUNK):
        chunk = ids[start : start + STORE_CHUNK]
        WorkItem.objects.using(using).filter(work_item_id__in=chunk).update(trace_context=carrier)


# --- the run: claim, process, and the ending -------------------------------------------------


def run[R](call: Callable[[Slot, WorkContext], R], slot: Slot, context: WorkContext) -> R:
    """`call(slot, context)`, the handler's run, under a consumer span when tracing is on."""
    if not enabled():
        return call(slot, context)
    return _traced_run(lambda: call(slot, context), slot.lease, received_ns(slot.claimed_at))


def received_ns(claimed_at: float) -> int:
    """The wall-clock time (ns) of a slot's receipt, from its `time.monotonic()` claim time."""
    return time.time_ns() - int((time.monotonic() - claimed_at) * 1e9)


def run_in_child[R](
    call: Callable[[], R],
    lease: Lease,
    received: int,
    started: Callable[[tuple[int, int, int]], None],
) -> R:
    """`call()`, a handler's run in a process-mode child, under its run span when tracing is
    on; `started` is given the span's ids (trace, span, flags) for the worker, whose settle
    span is its child. The spans are flushed after the run: the worker may SIGKILL the child."""
    if not enabled():
        return call()
    try:
        return _traced_run(call, lease, received, started)
    finally:
        _flush()


def child_run_started(lease: Lease, ids: tuple[int, ...]) -> None:
    """The worker's side of `run_in_child`: the child's run span, the parent of the run's
    ending (its settle span, a failure's checkpoint) written in this process."""
    if not enabled():
        return
    try:
        api = _api_or_fail()
        trace_id, span_id, flags = ids
        span_context = api.trace.SpanContext(
            trace_id, span_id, is_remote=True, trace_flags=api.trace.TraceFlags(flags)
        )
        _remember(lease.work_item_id, lease.token, span_context, lease.queue_name)
    except Exception:  # its ending is then untraced; the run goes on
        logger.exception("tracing the child run of %s failed", lease.work_item_id)


def _flush() -> None:
    api = _api_or_fail()
    flush = getattr(api.trace.get_tracer_provider(), "force_flush", None)
    if callable(flush):
        try:
            flush()
        except Exception:  # an exporter's failure is not the run's
            logger.warning("flushing the run's spans failed", exc_info=True)


def _stored_context(stored: Any) -> dict[str, str] | None:
    """The enqueuer's trace context as the claim returned it; None if there is none."""
    if not isinstance(stored, dict):
        return None
    return {k: v for k, v in stored.items() if isinstance(k, str) and isinstance(v, str)}


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1e9)


def _traced_run[R](
    call: Callable[[], R],
    lease: Lease,
    received: int,
    started: Callable[[tuple[int, int, int]], None] | None = None,
) -> R:
    api = _api_or_fail()
    try:
        span = _start_run(api, lease, received)
        token = api.context.attach(api.trace.set_span_in_context(span))
        if started is not None:
            ids = span.get_span_context()
            started((ids.trace_id, ids.span_id, int(ids.trace_flags)))
    except Exception:  # a bug of ours (or the SDK's) must not fail the work
        logger.exception("tracing the run of %s failed; it runs untraced", lease.work_item_id)
        return call()
    try:
        return call()
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(
            api.trace.Status(api.trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
        )
        raise
    finally:
        api.context.detach(token)
        span.end()


def _start_run(api: _Api, lease: Lease, received: int) -> Any:
    """The claim span (ended) and the run span (started) of a lease's run."""
    trace = api.trace
    carrier = _stored_context(lease.trace_context)
    enqueuer = api.propagate.extract(carrier) if carrier else api.context.Context()
    enqueued = trace.get_current_span(enqueuer).get_span_context()
    links = [trace.Link(enqueued)] if enqueued.is_valid else []
    parent = enqueuer if get_settings().tracing is True else api.context.Context()
    common = _base(lease.queue_name)
    common["messaging.message.id"] = lease.work_item_id
    common["leasing.lease.token"] = lease.token

    # The claim: from the database's claim time to the dispatcher's receipt of the lease
    # (clocks apart by a little are clamped: the span never ends before it starts).
    claim = api.tracer.start_span(
        _name("claim", lease.queue_name),
        context=parent,
        kind=trace.SpanKind.CLIENT,
        links=links,
        start_time=min(_ns(lease.acquired_at), received),
        attributes={
            **common,
            "messaging.operation.type": "receive",
            "messaging.operation.name": "claim",
            "leasing.worker.id": lease.worker_id,
        },
    )
    claim.end(end_time=received)

    attributes = {
        **common,
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "leasing.work_type": lease.work_type,
        "leasing.task_id": lease.task_id,
        "leasing.attempt": lease.retry_count + 1,
        "leasing.worker.id": lease.worker_id,
    }
    span = api.tracer.start_span(
        _name("run", lease.queue_name),
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
    )
    _remember(lease.work_item_id, lease.token, span.get_span_context(), lease.queue_name)
    return span


class _Run:
    """A traced run in this process: the parent of its ending and of the checkpoints the
    worker writes for it after its span ended (a failure's error boundary)."""

    __slots__ = ("queue", "settled", "span_context", "token")

    def __init__(self, token: int, span_context: Any, queue: str) -> None:
        self.token = token
        self.span_context = span_context
        self.queue = queue
        self.settled = False


# The latest traced run of each item, oldest first. Bounded: runs whose ending never comes
# here (a lost lease, the sweep) cannot grow it without end.
_runs: OrderedDict[str, _Run] = OrderedDict()
_runs_lock = threading.Lock()
# Whether `_on_released` listens to lease_released: only once a traced run started, since a
# listener makes every release build its signal's events.
_listening = False


def _remember(work_item_id: str, token: int, span_context: Any, queue: str) -> None:
    with _runs_lock:
        _runs.pop(work_item_id, None)
        _runs[work_item_id] = _Run(token, span_context, queue)
        while len(_runs) > MAX_RUNS_REMEMBERED:
            _runs.popitem(last=False)
    global _listening
    if not _listening:
        signals.lease_released.connect(_on_released, dispatch_uid=__name__)
        _listening = True


def _on_released(
    sender: Any, work_item_id: str, token: int, status: str = "", **kwargs: Any
) -> None:
    """The ending of a traced run: a settle span under its process span."""
    with _runs_lock:
        found = _runs.get(work_item_id)
        if found is None or found.token != token or found.settled:
            return
        found.settled = True
    api = _api
    if api is None:
        return
    span_context, queue = found.span_context, found.queue
    trace = api.trace
    ending = ENDINGS.get(status, status)
    parent = trace.set_span_in_context(trace.NonRecordingSpan(span_context))
    attributes = _base(queue)
    attributes.update(
        {
            "messaging.message.id": work_item_id,
            "messaging.operation.type": "settle",
            "messaging.operation.name": "settle",
            "leasing.lease.token": token,
            "leasing.ending": ending,
        }
    )
    span = api.tracer.start_span(
        _name("settle", queue), context=parent, kind=trace.SpanKind.CLIENT, attributes=attributes
    )
    span.add_event(f"leasing.{ending}")
    span.end()


def _on_expired(
    sender: Any, work_item_id: str, token: int, status: str = "", **kwargs: Any
) -> None:
    """An expired lease the sweep recovered: a settle span in the item's trace (the sweep's
    process ran nothing of it, so under the enqueuer's context, or linked to it)."""
    api = _loaded() if _tracing_on() else None
    if api is None:
        return
    from .models import WorkItem

    try:
        found = (
            WorkItem.objects.filter(pk=work_item_id)
            .values_list("trace_context", "queue_name")
            .first()
        )
    except Exception:  # the sweep's work is done; its span is not worth an error
        logger.warning("reading the trace context of %s failed", work_item_id, exc_info=True)
        return
    if found is None:
        return
    stored, queue = found
    carrier = _stored_context(stored)
    if not carrier:
        return
    trace = api.trace
    enqueuer = api.propagate.extract(carrier)
    enqueued = trace.get_current_span(enqueuer).get_span_context()
    if not enqueued.is_valid:
        return
    parent = enqueuer if get_settings().tracing is True else api.context.Context()
    ending = ENDINGS.get(status, status)
    attributes = _base(queue)
    attributes.update(
        {
            "messaging.message.id": work_item_id,
            "messaging.operation.type": "settle",
            "messaging.operation.name": "settle",
            "leasing.lease.token": token,
            "leasing.ending": ending,
            "leasing.lease.expired": True,
            "leasing.timed_out": bool(kwargs.get("timed_out")),
        }
    )
    span = api.tracer.start_span(
        _name("settle", queue),
        context=parent,
        kind=trace.SpanKind.CLIENT,
        links=[trace.Link(enqueued)],
        attributes=attributes,
    )
    span.add_event("leasing.lease_expired")
    span.add_event(f"leasing.{ending}")
    span.end()


def _tracing_on() -> bool:
    try:
        return bool(get_settings().tracing)
    except Exception:  # bad settings: the system check and the next use of them say so
        return False


def listen() -> None:
    """At start-up (`LeasingConfig.ready`): follow the sweep's recoveries while tracing is on.

    A listener makes every recovery report its items, so none is connected while it is off.
    """
    if _tracing_on():
        signals.lease_expired.connect(_on_expired, dispatch_uid=__name__)
    else:
        signals.lease_expired.disconnect(dispatch_uid=__name__)


@receiver(setting_changed)
def _tracing_changed(*, setting: str, **kwargs: Any) -> None:
    """Tracing turned off: stop listening for endings."""
    global _listening
    if setting != "LEASING":
        return
    listen()
    if not _tracing_on():
        signals.lease_released.disconnect(dispatch_uid=__name__)
        _listening = False
        with _runs_lock:
            _runs.clear()


def _run_context(api: _Api, work_item_id: str | None) -> Any:
    """The parent of a span about an item: the current span, or else its latest run's in this
    process (the failure checkpoint a worker writes after the handler's span ended); None:
    the current context."""
    if work_item_id is None or api.trace.get_current_span().get_span_context().is_valid:
        return None
    with _runs_lock:
        found = _runs.get(work_item_id)
    if found is None:
        return None
    return api.trace.set_span_in_context(api.trace.NonRecordingSpan(found.span_context))


# --- checkpoints and run_once ----------------------------------------------------------------


def traced_checkpoint[**P, R](fn: Callable[P, R]) -> Callable[P, R]:
    """`create_checkpoint` under a `checkpoint` span when tracing is on."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def checkpoint(*args: P.args, **kwargs: P.kwargs) -> R:
        if not enabled():
            return fn(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return fn(*args, **kwargs)  # raises the caller's mistake
        api = _api_or_fail()
        lease = bound.get("lease")
        item = getattr(lease, "work_item_id", None) or bound.get("work_item")
        item_id = getattr(item, "work_item_id", item)
        attributes = _base(getattr(lease, "queue_name", None))
        attributes["leasing.task_id"] = str(bound.get("task_id"))
        attributes["leasing.checkpoint.type"] = str(bound.get("checkpoint_type"))
        if isinstance(item_id, str):
            attributes["messaging.message.id"] = item_id
        parent = _run_context(api, item_id if isinstance(item_id, str) else None)
        with api.tracer.start_as_current_span(
            "checkpoint", context=parent, attributes=attributes
        ) as span:
            result = fn(*args, **kwargs)
            span.set_attribute("leasing.checkpoint.sequence", getattr(result, "sequence_number", 0))
            return result

    return checkpoint


def traced_run_once[**P, R](fn: Callable[P, R]) -> Callable[P, R]:
    """`run_once` under a `run_once` span when tracing is on, saying whether `fn` ran."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def run_once(*args: P.args, **kwargs: P.kwargs) -> R:
        if not enabled():
            return fn(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)
        effect = bound.arguments.get("fn")
        if not callable(effect):
            return fn(*args, **kwargs)  # refused with the function's own error
        api = _api_or_fail()
        lease = bound.arguments.get("lease")
        attributes = _base(getattr(lease, "queue_name", None))
        attributes["leasing.idempotency.key"] = str(bound.arguments.get("key"))
        if lease is not None:
            attributes["messaging.message.id"] = str(getattr(lease, "work_item_id", ""))
        ran = []

        def effect_once() -> Any:
            ran.append(True)
            return effect()

        bound.arguments["fn"] = effect_once
        with api.tracer.start_as_current_span("run_once", attributes=attributes) as span:
            try:
                return fn(*bound.args, **bound.kwargs)
            finally:
                span.set_attribute("leasing.run_once.ran", bool(ran))

    return run_once


# --- the console -----------------------------------------------------------------------------


def trace_id(trace_context: Any) -> str | None:
    """The trace id in a stored trace context (its traceparent), without opentelemetry."""
    if not isinstance(trace_context, dict):
        return None
    parent = trace_context.get("traceparent")
    if not isinstance(parent, str):
        return None
    parts = parent.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return None
    try:
        int(parts[1], 16)
    except ValueError:
        return None
    return parts[1].lower()
