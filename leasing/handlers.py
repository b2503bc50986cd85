"""Handlers: the registry of work types, and the context a handler runs with.

    from leasing.handlers import handler

    @handler("send_invoice", heartbeat="beat", lease_duration=120, on_lease_expired="fail")
    def send_invoice(ctx):
        state = ctx.resume_state() or {"page": 0}
        ...
        ctx.beat()
        ctx.checkpoint("iteration_end", state)
        return {"sent": True}

Handlers are registered by decorator in any installed app's `handlers.py`
(imported by `autodiscover()` when the app registry is ready) or listed in
`LEASING["HANDLERS"]` as `{"work_type": "dotted.path"}` or
`{"work_type": {"handler": "dotted.path", ...options}}`.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from asgiref.sync import iscoroutinefunction
from django.utils.module_loading import autodiscover_modules, import_string

from . import validation
from .conf import get_settings
from .exceptions import InvalidInput, LeasingConfigurationError, UnknownWorkType

if TYPE_CHECKING:  # the context is built by the worker, a layer above this registry
    from .context import WorkContext

HeartbeatMode = Literal["thread", "beat"]
ExpiryPolicy = Literal["retry", "fail"]
ExecutionMode = Literal["thread", "process"]
HEARTBEAT_MODES: tuple[str, ...] = ("thread", "beat")
EXPIRY_POLICIES: tuple[str, ...] = ("retry", "fail")
EXECUTION_MODES: tuple[str, ...] = ("thread", "process")


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler and its per-type options.

    `lease_duration` and `heartbeat_interval` default to the worker's (and so to
    `LEASING`); `max_retries` is the default for items enqueued without one;
    `on_lease_expired="fail"` makes an expired (or timed-out) item fail instead
    of being retried, for work that must not run twice. `timeout` is the most
    one run may take, in seconds; `max_lease_lifetime` overrides
    `LEASING["MAX_LEASE_LIFETIME"]` for the type. A run is cut off at the
    smaller of the two. `execution="process"` runs the type's handler in a child
    process of the worker, which can be stopped (`docs/how-to/execution-modes.md`);
    None leaves it to the worker (`runworker --execution`, threads by default).
    """

    work_type: str
    func: Callable[[WorkContext], Any]
    lease_duration: float | None = None
    heartbeat_interval: float | None = None
    heartbeat: HeartbeatMode = "thread"
    max_retries: int | None = None
    on_lease_expired: ExpiryPolicy = "retry"
    timeout: float | None = None
    max_lease_lifetime: float | None = None
    execution: ExecutionMode | None = None

    def cap_seconds(self, default_lifetime: float) -> float:
        """The most a lease of this type can live from its claim."""
        lifetime = self.max_lease_lifetime or default_lifetime
        return lifetime if self.timeout is None else min(self.timeout, lifetime)

    @property
    def dotted_path(self) -> str:
        return f"{self.func.__module__}.{getattr(self.func, '__qualname__', self.func)}"

    def importable(self) -> bool:
        """Whether a fresh process finds this handler by its dotted path, as a worker's
        child process must (not a function defined in another function, or replaced)."""
        try:
            return bool(import_string(self.dotted_path) is self.func)
        except ImportError:
            return False


def build_spec(work_type: str, func: Any, **options: Any) -> HandlerSpec:
    """Validate a handler registration (raises `LeasingConfigurationError`)."""
    try:
        work_type = validation.non_empty_text("work_type", work_type)
    except InvalidInput as exc:
        raise LeasingConfigurationError(str(exc)) from exc
    if not callable(func):
        raise LeasingConfigurationError(f"Handler for {work_type!r} is not callable: {func!r}.")
    if _is_async(func):
        # Its call would only make a coroutine; and the context's methods use the
        # database synchronously, which Django refuses inside an event loop.
        raise LeasingConfigurationError(
            f"Handler for {work_type!r} is async ({getattr(func, '__qualname__', func)!r}): "
            "a handler must be a synchronous function. Call the async code from one "
            "with asgiref.sync.async_to_sync, or make it a Django task (@task on an "
            "async def), which leasing's Tasks backend runs."
        )
    unknown = set(options) - {
        "lease_duration",
        "heartbeat_interval",
        "heartbeat",
        "max_retries",
        "on_lease_expired",
        "timeout",
        "max_lease_lifetime",
        "execution",
    }
    if unknown:
        raise LeasingConfigurationError(
            f"Unknown option(s) {sorted(unknown)} for handler {work_type!r}."
        )
    try:
        lease = options.get("lease_duration")
        if lease is not None:
            lease = validation.positive_seconds(f"{work_type}: lease_duration", lease)
        interval = options.get("heartbeat_interval")
        if interval is not None:
            interval = validation.positive_seconds(f"{work_type}: heartbeat_interval", interval)
        if lease is not None and interval is not None:
            validation.heartbeat_below_lease(interval, lease)
        timeout, lifetime = options.get("timeout"), options.get("max_lease_lifetime")
        if timeout is not None:
            timeout = validation.positive_seconds(f"{work_type}: timeout", timeout)
        if lifetime is not None:
            lifetime = validation.positive_seconds(f"{work_type}: max_lease_lifetime", lifetime)
        max_retries = options.get("max_retries")
        if max_retries is not None:
            # Each item's max_retries column is an int4: a larger default fails every enqueue.
            max_retries = validation.integer(
                f"{work_type}: max_retries", max_retries, minimum=0, maximum=validation.PG_INT_MAX
            )
    except InvalidInput as exc:
        raise LeasingConfigurationError(str(exc)) from exc
    mode = options.get("heartbeat", "thread")
    if mode not in HEARTBEAT_MODES:
        raise LeasingConfigurationError(
            f"{work_type}: heartbeat must be 'thread' or 'beat', got {validation._short(mode)}."
        )
    policy = options.get("on_lease_expired", "retry")
    if policy not in EXPIRY_POLICIES:
        raise LeasingConfigurationError(
            f"{work_type}: on_lease_expired must be 'retry' or 'fail', "
            f"got {validation._short(policy)}."
        )
    execution = options.get("execution")
    if execution is not None and execution not in EXECUTION_MODES:
        raise LeasingConfigurationError(
            f"{work_type}: execution must be 'thread', 'process' or None, "
            f"got {validation._short(execution)}."
        )
    return HandlerSpec(
        work_type=work_type,
        func=func,
        lease_duration=lease,
        heartbeat_interval=interval,
        heartbeat=mode,
        max_retries=max_retries,
        on_lease_expired=policy,
        timeout=timeout,
        max_lease_lifetime=lifetime,
        execution=execution,
    )


def _is_async(func: Any) -> bool:
    """An `async def` function or generator, or a callable marked or wrapped as one."""
    return (
        iscoroutinefunction(func)
        or inspect.isasyncgenfunction(func)
        or iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004
    )


class HandlerRegistry:
    """Handlers by work type. Thread-safe; one registration per type."""

    def __init__(self) -> None:
        self._specs: dict[str, HandlerSpec] = {}
        self._lock = threading.Lock()
        self._settings_loaded = False

    def register(
        self, work_type: str, func: Any, *, replace: bool = False, **options: Any
    ) -> HandlerSpec:
        spec = build_spec(work_type, func, **options)
        with self._lock:
            existing = self._specs.get(spec.work_type)
            if existing is not None and not replace and existing.func is not spec.func:
                raise LeasingConfigurationError(
                    f"Work type {spec.work_type!r} already has a handler "
                    f"({existing.dotted_path}); a work type has exactly one."
                )
            self._specs[spec.work_type] = spec
        return spec

    def unregister(self, work_type: str) -> None:
        with self._lock:
            self._specs.pop(work_type, None)

    def get(self, work_type: str) -> HandlerSpec:
        self.load_settings()
        try:
            return self._specs[work_type]
        except KeyError:
            raise UnknownWorkType(
                f"No handler is registered for work type {work_type!r}; "
                f"known types: {', '.join(sorted(self._specs)) or '(none)'}."
            ) from None

    def __contains__(self, work_type: object) -> bool:
        self.load_settings()
        return work_type in self._specs

    def work_types(self) -> list[str]:
        self.load_settings()
        return sorted(self._specs)

    def specs(self) -> list[HandlerSpec]:
        self.load_settings()
        return [self._specs[t] for t in sorted(self._specs)]

    def fail_on_expiry_types(self) -> list[str]:
        """Work types whose expired items the sweep fails instead of retrying."""
        self.load_settings()
        return sorted(t for t, s in self._specs.items() if s.on_lease_expired == "fail")

    def default_max_retries(self, work_type: str) -> int | None:
        self.load_settings()
        spec = self._specs.get(work_type)
        return spec.max_retries if spec else None

    def load_settings(self, *, force: bool = False) -> None:
        """Register the handlers listed in `LEASING["HANDLERS"]` (once)."""
        if self._settings_loaded and not force:
            return
        for work_type, entry in get_settings().handlers.items():
            if isinstance(entry, str):
                path, options = entry, {}
            elif isinstance(entry, dict) and isinstance(entry.get("handler"), str):
                options = dict(entry)
                path = options.pop("handler")
            else:
                raise LeasingConfigurationError(
                    f"LEASING['HANDLERS'][{work_type!r}] must be a dotted path or a dict "
                    "with a 'handler' dotted path and options."
                )
            try:
                func = import_string(path)
            except Exception as exc:
                # Not only ImportError: a module that raises as it loads (ValueError,
                # SyntaxError...) is a bad entry too (leasing.E010), not a crash of the check.
                raise LeasingConfigurationError(
                    f"LEASING['HANDLERS'][{work_type!r}]: cannot import {path!r}: {exc}"
                ) from exc
            self.register(work_type, func, replace=True, **options)
        self._settings_loaded = True

    def reset_settings(self) -> None:
        self._settings_loaded = False


registry = HandlerRegistry()


def handler(
    work_type: str,
    *,
    lease_duration: float | None = None,
    heartbeat_interval: float | None = None,
    heartbeat: HeartbeatMode = "thread",
    max_retries: int | None = None,
    on_lease_expired: ExpiryPolicy = "retry",
    timeout: float | None = None,
    max_lease_lifetime: float | None = None,
    execution: ExecutionMode | None = None,
) -> Callable[[Callable[[WorkContext], Any]], Callable[[WorkContext], Any]]:
    """Register the decorated function as the handler of `work_type`."""

    def decorator(func: Callable[[WorkContext], Any]) -> Callable[[WorkContext], Any]:
        registry.register(
            work_type,
            func,
            lease_duration=lease_duration,
            heartbeat_interval=heartbeat_interval,
            heartbeat=heartbeat,
            max_retries=max_retries,
            on_lease_expired=on_lease_expired,
            timeout=timeout,
            max_lease_lifetime=max_lease_lifetime,
            execution=execution,
        )
        return func

    return decorator


def autodiscover() -> None:
    """Import `handlers` of every installed app; `LEASING["HANDLERS"]` loads on first use."""
    autodiscover_modules("handlers")
    registry.reset_settings()
