"""Typed settings for the leasing app, read lazily from `settings.LEASING`.

    from leasing.conf import leasing_settings
    leasing_settings.lease_duration  # 300.0 unless LEASING["LEASE_DURATION"] says otherwise

Nothing is read at import time: the first attribute access builds a frozen
`LeasingSettings` from `settings.LEASING` (validated, unknown keys rejected) and
caches it until Django's `setting_changed` signal says `LEASING` changed.

The rules are the runtime's (`leasing.validation`), so that a setting
`manage.py check` accepts never stops work at run time. A bad entry of a
limit or a schedule (`leasing.setting_entries`) costs only itself: a process
that runs anyway logs it once and skips it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS
from django.dispatch import receiver

# Modules, not their names: `validation` imports this module, and `setting_entries`
# imports `validation` (each one's names are used only once everything is loaded).
from . import setting_entries, validation
from .exceptions import InvalidInput, LeasingConfigurationError

if TYPE_CHECKING:
    from .rates import RateLimit
    from .setting_entries import SettingProblem
    from .ticks import ScheduleSpec

MIB = 1024 * 1024


# Retries spread by +/- this fraction of their delay, so items that failed together do not
# retry together. Once the RETRY_JITTER setting; no project needed another value.
RETRY_JITTER = 0.25


@dataclass(frozen=True, slots=True)
class LeasingSettings:
    """`settings.LEASING`, typed. Each field's `#:` comment is its line in the reference.

    The documentation site renders these comments (docs/hooks), grouped by the
    plain `# Group` comments, so a setting without one fails `make docs`. The
    last group, Tuning, holds the settings whose defaults suit nearly every
    project; the reference says so.
    """

    # Leases
    #: Seconds a lease lasts without renewal: how long a dead worker's item waits for the sweep.
    lease_duration: float = 300.0
    #: Seconds between renewals of a running item's lease, so a live worker keeps it; below the
    #: lease (leasing.E002).
    heartbeat_interval: float = 30.0

    # Retries
    #: Retries of a failed item, so a passing failure costs no work; for items enqueued without
    #: `max_retries` whose handler sets none.
    max_retries: int = 3
    #: Seconds before the first retry of a failed attempt; each further retry waits twice as long
    #: (spread by +/-25% so that items that failed together do not retry together).
    retry_backoff_base: float = 2.0

    # Recovery sweep
    #: Seconds between sweep passes: a dead worker's item is back within lease + this.
    sweep_interval: float = 60.0
    #: Checkpoints the sweep keeps per task (newest first), besides the task's resume point (its
    #: newest `iteration_end`), which it always keeps.
    checkpoint_retention: int = 100

    # Idempotency keys
    #: Seconds a `run_once` key and its stored response live, counted once the key's item (if
    #: any) has completed: a key never expires while its item may run again (running, waiting
    #: for a retry, or failed or cancelled, which an operator may retry).
    idempotency_ttl: float = 24 * 3600.0

    # Workers
    #: Handlers listed in the settings instead of an app's `handlers.py` (a library's function,
    #: options that differ per deployment): `{"type": "dotted.path"}` or
    #: `{"type": {"handler": "dotted.path", **options}}`.
    handlers: dict[str, Any] = field(default_factory=dict)
    #: True: a process may enqueue work types it has no handler for (a web process feeding
    #: workers elsewhere); False: such an enqueue fails at once, catching a misspelt type.
    allow_unregistered_types: bool = False
    #: Seconds running items get to finish after SIGTERM before they are handed back; below the
    #: service manager's stop timeout (systemd's `TimeoutStopSec`).
    shutdown_timeout: float = 30.0
    #: Abandoned runs (fenced out while their handler thread still runs) a thread-mode worker
    #: tolerates; past it the worker stops claiming, finishes its running items and exits with
    #: status 75 so the service manager starts a fresh process. 0: exit at the first.
    max_abandoned_runs: int = 4

    # Schedules and concurrency limits
    #: Periodic work by name: one item per cron or interval tick (each entry checked: E006).
    schedules: dict[str, ScheduleSpec] = field(default_factory=dict)
    #: At most N items in flight (claimed, not yet finished) per queue, across every worker and
    #: host, e.g. for a rate-limited API; each at most 2147483647.
    queue_limits: dict[str, int] = field(default_factory=dict)
    #: At most N items in flight per work type, across every worker and host, e.g. for a
    #: handler that holds a scarce resource; each at most 2147483647.
    work_type_limits: dict[str, int] = field(default_factory=dict)

    # Rate limits and fair claims
    #: Rate limits held inside the claim across every worker and host, by bucket
    #: (`queue:<name>`, `work_type:<name>`, `key:<rate key>`, `key:*`): `{"key:*": "10/s"}` or
    #: `{"limit": 50, "per": 1, "burst": 55}`; an item waiting on one stays pending (each entry
    #: checked: E012).
    rate_limits: dict[str, RateLimit | None] = field(default_factory=dict)
    #: Queues whose claims take turns across the items' `fairness_key`s (tenants), so one key's
    #: backlog does not hold the others back.
    fair_queues: tuple[str, ...] = ()
    #: Turns per round of a fairness key in a fair queue (default 1, at most 1000000), e.g.
    #: `{"premium": 3}`.
    fairness_weights: dict[str, int] = field(default_factory=dict)

    # Databases, console and metrics
    #: The alias the console reads from (dashboard, lists and item pages, timeline, history,
    #: /metrics), e.g. a streaming replica; None: the default database. Lease writes, and every
    #: read that decides one (an operator action's re-read), always go to the default database.
    read_database: str | None = None
    #: The alias whose session connection the NOTIFY listener uses (default: the worker's own);
    #: behind a transaction pooler, a direct connection.
    listen_database: str | None = None
    #: Bearer token that lets Prometheus scrape /metrics (printable, no leading or trailing
    #: whitespace: an HTTP header carries it); None: staff sessions only.
    metrics_token: str | None = None

    # Tracing
    #: OpenTelemetry spans for enqueue, claim, run, checkpoints, `run_once` and endings, the run
    #: continuing the enqueuer's trace (needs the `otel` extra; leasing.W010). `"link"`: each run
    #: starts a trace of its own, linked to the enqueuer's. False: nothing is traced or imported.
    tracing: bool | str = False
    #: The console's link from an item to its trace, e.g. `"https://jaeger/trace/{trace_id}"`
    #: (http://, https:// or a path on this site); None: the item page shows the trace id only.
    trace_url: str | None = None

    # Tuning
    #: Failed renewals in a row (database unreachable) after which the worker gives the lease up
    #: and tells the handler, rather than run on under a lease it can no longer keep.
    heartbeat_max_failures: int = 3
    #: The most a lease can live from its claim, whatever its renewals (per-type
    #: `max_lease_lifetime` and `timeout` handler options can lower it), so no lease is immortal.
    max_lease_lifetime: float = 4 * 3600.0
    #: The longest a retry waits, in seconds, however many retries came before, so an item with
    #: many retries is still tried again within this.
    retry_backoff_max: float = 3600.0
    #: Expired items the sweep recovers per transaction, so one pass never holds many row locks
    #: at once.
    sweep_batch_size: int = 2000
    #: The most seconds before the console calls a heartbeat stale (each work type's threshold
    #: is three of its heartbeat periods, at most this); above every heartbeat interval
    #: (leasing.W004).
    stale_heartbeat: float = 120.0
    #: Seconds an idle worker waits between claims (+/-20% jitter): the only wake-up on SQLite,
    #: a fallback to NOTIFY on PostgreSQL (where a worker that does not answer wakes polls for
    #: items at least 0.25 s old: the fresher ones are the answering worker's).
    poll_interval: float = 1.0
    #: Items a worker claims beyond its free threads; None: adaptive, it claims ahead only while
    #: its handlers are fast, so slow work is never hoarded. 0: never ahead.
    prefetch: int | None = None
    #: Idle PostgreSQL workers wait for NOTIFY on enqueue; False: they only poll (a pooler that
    #: cannot pass LISTEN and no LISTEN_DATABASE).
    listen: bool = True
    #: Largest JSON payload (input, output, snapshot, response) in bytes, so one item cannot
    #: bloat the tables.
    max_payload_bytes: int = MIB
    #: `beat` mode: the most seconds between two extensions of a beating handler's lease (the
    #: worker also keeps it within the type's heartbeat interval and half the lease).
    extender_interval: float = 60.0
    #: Seconds each extension adds, for a `LeaseExtender` built from the settings (the worker's
    #: `beat` mode extends by the lease duration).
    extender_extension: float = 300.0
    #: False: a `LeaseExtender` built from the settings extends nothing (proof-of-work extension
    #: switched off for the deployment).
    extender_enabled: bool = True
    #: Process execution: items a child process runs before the worker replaces it with a fresh
    #: one, so what a handler leaks (memory, file handles, module state) is given back.
    process_max_items: int = 1000
    #: Process execution: a child whose resident memory exceeds this many MiB after an item is
    #: replaced, so one large item does not keep its memory for the child's life.
    process_max_memory_mb: int = 1024
    #: Process execution: seconds a cancelled run gets to stop by itself before its child gets
    #: SIGTERM, and a child gets after SIGTERM before SIGKILL; below SHUTDOWN_TIMEOUT (W006).
    process_stop_grace: float = 5.0


# Seconds: positive, and no more than any `validation.positive_seconds` at run time takes.
_SECONDS = {
    "lease_duration",
    "heartbeat_interval",
    "retry_backoff_base",
    "retry_backoff_max",
    "sweep_interval",
    "stale_heartbeat",
    "idempotency_ttl",
    "extender_interval",
    "extender_extension",
    "poll_interval",
    "shutdown_timeout",
    "max_lease_lifetime",
    "process_stop_grace",
}


def _integer_range(name: str) -> tuple[int, int] | None:
    """An integer setting's (minimum, maximum): the range the runtime takes (a column, the
    sweep's batch). A function: `validation` is half-imported while this module loads."""
    return {
        "heartbeat_max_failures": (1, validation.MAX_BIGINT),
        "sweep_batch_size": (1, validation.MAX_SWEEP_BATCH_SIZE),
        "checkpoint_retention": (1, validation.MAX_BIGINT),
        "max_payload_bytes": (1, validation.MAX_BIGINT),
        "max_retries": (0, validation.PG_INT_MAX),  # each item's max_retries column
        "max_abandoned_runs": (0, validation.PG_INT_MAX),  # the workers row's count
        "process_max_items": (1, validation.MAX_BIGINT),
        "process_max_memory_mb": (1, validation.MAX_BIGINT),
    }.get(name)


# The most items a worker claims ahead of its free threads (PREFETCH).
MAX_PREFETCH = 1000

# Keys of LEASING that earlier releases read and this one ignores, with what replaced
# them: a project that still sets one keeps working (leasing.W005 says to remove it).
RETIRED = {
    "RETRY_JITTER": "retries always spread by +/-25% of their delay",
}

# Settings made of entries (a limit, a schedule): one bad entry costs only itself at run
# time (logged and skipped); read after the others, as schedules need MAX_PAYLOAD_BYTES.
_ENTRY_SETTINGS = (
    "queue_limits",
    "work_type_limits",
    "schedules",
    "rate_limits",
    "fair_queues",
    "fairness_weights",
)


def _check_value(name: str, value: Any) -> Any:
    key = f"LEASING[{name.upper()!r}]"
    try:
        if name in _SECONDS:
            return validation.positive_seconds(key, value)
        bounds = _integer_range(name)
        if bounds is not None:
            return validation.integer(key, value, minimum=bounds[0], maximum=bounds[1])
    except InvalidInput as exc:
        raise LeasingConfigurationError(str(exc)) from None
    if name == "prefetch":
        if value is None:
            return None
        try:
            return validation.integer(key, value, minimum=0, maximum=MAX_PREFETCH)
        except InvalidInput as exc:
            raise LeasingConfigurationError(f"{exc} None: adaptive.") from None
    if name in ("extender_enabled", "allow_unregistered_types", "listen"):
        if not isinstance(value, bool):
            raise LeasingConfigurationError(
                f"{key} must be True or False, got {validation._short(value)}."
            )
        return value
    if name == "handlers":
        if not isinstance(value, dict):
            raise LeasingConfigurationError(
                f"{key} must be a dict of work type to handler, got {type(value).__name__}."
            )
        return dict(value)
    if name in ("listen_database", "read_database"):
        # Whether DATABASES has the alias is the system check's (E007, E009): the
        # settings are read before the connections are.
        if value is not None and (not isinstance(value, str) or not value):
            raise LeasingConfigurationError(f"{key} must be a database alias or None.")
        return value
    if name == "tracing":
        if value not in (True, False, "link") or type(value) not in (bool, str):
            raise LeasingConfigurationError(
                f"{key} must be True, False or 'link', got {validation._short(value)}."
            )
        return value
    if name == "trace_url":
        return None if value is None else _trace_url(key, value)
    if name == "metrics_token":
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise LeasingConfigurationError(f"{key} must be a non-empty string or None.")
        if value is not None:
            _text(key, value)  # a NUL or a lone surrogate, said as such
        if value is not None and value != value.strip():
            # The view strips the token it receives: such a token could never match.
            raise LeasingConfigurationError(
                f"{key} must have no leading or trailing whitespace (an HTTP header "
                "carries it): no request could ever present it."
            )
        if value is not None and not value.isprintable():
            raise LeasingConfigurationError(
                f"{key} must be printable (no control characters): an HTTP header "
                "cannot carry them."
            )
        return value
    raise AssertionError(f"no validator for {name}")  # pragma: no cover


def _trace_url(key: str, value: Any) -> str:
    """A link template with a `{trace_id}` placeholder and no other."""
    if not isinstance(value, str) or "{trace_id}" not in value:
        raise LeasingConfigurationError(
            f"{key} must be a URL with a {{trace_id}} placeholder or None, "
            f"got {validation._short(value)}."
        )
    try:
        value.format(trace_id="0" * 32)
    except (KeyError, IndexError, ValueError):
        raise LeasingConfigurationError(
            f"{key} may hold no placeholder but {{trace_id}} (write a literal brace twice), "
            f"got {validation._short(value)}."
        ) from None
    # The console renders it as a link: a `javascript:` (or any other) scheme would run
    # in the operator's session.
    if not value.lower().startswith(("https://", "http://", "/")):
        raise LeasingConfigurationError(
            f"{key} must start with https://, http:// or / (a link the console shows), "
            f"got {validation._short(value)}."
        )
    return _text(key, value)


def _text(key: str, value: str) -> str:
    """Storable text (`validation.storable_text`), as a configuration error."""
    try:
        return validation.storable_text(key, value)
    except InvalidInput as exc:
        raise LeasingConfigurationError(str(exc)) from None


def read_settings(
    overrides: dict[str, Any] | None,
) -> tuple[LeasingSettings, tuple[SettingProblem, ...]]:
    """The typed settings of `settings.LEASING`, and everything wrong in it.

    Never raises: a bad entry of a limit or a schedule is left out of the
    settings (the others stay); any other bad key leaves its default, and its
    problem is not an `entry` one: the lazy settings raise it, the system
    check reports it.
    """
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        message = f"settings.LEASING must be a dict, got {type(overrides).__name__}."
        return LeasingSettings(), (setting_entries.SettingProblem("LEASING", message),)
    known = {f.name for f in dataclasses.fields(LeasingSettings)}
    values: dict[str, Any] = {}
    entries: dict[str, Any] = {}
    problems: list[SettingProblem] = list(_spelt_twice(overrides, known))
    # Keys are read whatever their case: of two spellings of one setting, the last applies.
    last = {str(raw_key).lower(): raw_key for raw_key in overrides}
    for raw_key, value in overrides.items():
        name = str(raw_key).lower()
        if name.upper() in RETIRED:
            continue  # leasing.W005 (retired_keys)
        if name in known and last[name] is not raw_key:
            continue  # spelt again later: _spelt_twice
        if name not in known:
            choices = ", ".join(sorted(n.upper() for n in known))
            message = f"Unknown setting LEASING[{raw_key!r}]. Known settings: {choices}."
            problems.append(setting_entries.SettingProblem(str(raw_key), message))
        elif name in _ENTRY_SETTINGS:
            entries[name] = value
        else:
            try:
                values[name] = _check_value(name, value)
            except LeasingConfigurationError as exc:
                problems.append(setting_entries.SettingProblem(name.upper(), str(exc)))
    for name, value in entries.items():
        if name == "schedules":
            limit = values.get("max_payload_bytes", MIB)
            values[name], found = setting_entries.read_schedules(value, max_payload_bytes=limit)
        elif name == "rate_limits":
            values[name], found = setting_entries.read_rate_limits(value)
        elif name == "fair_queues":
            values[name], found = setting_entries.read_fair_queues(value)
        else:
            values[name], found = setting_entries.read_limits(name.upper(), value)
        problems += found
    return LeasingSettings(**values), tuple(problems)


def _spelt_twice(overrides: dict[Any, Any], known: set[str]) -> Iterator[SettingProblem]:
    """A problem for each setting LEASING holds under keys that differ only in case.

    Keys are matched case-insensitively, so only the last of them is read and the
    others would be dropped without a word. The check refuses it (leasing.E001);
    a process that runs anyway logs it once and reads the last spelling, as it
    always did, so it does not stop work over it.
    """
    spellings: dict[str, list[str]] = {}
    for raw_key in overrides:
        name = str(raw_key).lower()
        if name in known:
            spellings.setdefault(name, []).append(str(raw_key))
    for name, keys in spellings.items():
        if len(keys) < 2:
            continue
        shown = ", ".join(repr(key) for key in keys)
        message = (
            f"settings.LEASING sets {name.upper()} {len(keys)} times, as {shown}: keys are "
            f"read whatever their case, so only the last, {keys[-1]!r}, applies and the "
            "others are ignored."
        )
        yield setting_entries.SettingProblem(name.upper(), message, entry=True, spelt_twice=True)


def retired_keys(overrides: Any) -> list[str]:
    """The keys of `settings.LEASING` this release no longer reads (see RETIRED)."""
    if not isinstance(overrides, dict):
        return []
    return [str(key) for key in overrides if str(key).upper() in RETIRED]


logger = logging.getLogger("leasing.conf")


def _runtime_settings(overrides: dict[str, Any] | None) -> LeasingSettings:
    """The settings a process runs with: a bad limit or schedule is logged (once: the
    result is cached until LEASING changes) and skipped; any other problem raises.

    `manage.py check` reports every one of them; this is for a process that
    runs without the check (an embedded worker, settings changed under it),
    which keeps every other queue and schedule working.
    """
    conf, problems = read_settings(overrides)
    for problem in problems:
        if not problem.entry:
            raise problem.error()
    for problem in problems:
        kept = "The last spelling applies" if problem.spelt_twice else "Skipped"
        logger.error("%s %s; the rest of LEASING applies (manage.py check).", problem.message, kept)
    return conf


class _LazySettings:
    """Proxy that builds `LeasingSettings` on first use and after `LEASING` changes."""

    def __init__(self) -> None:
        self._cached: LeasingSettings | None = None
        self._lock = threading.Lock()

    def _load(self) -> LeasingSettings:
        cached = self._cached
        if cached is None:
            from django.conf import settings

            with self._lock:
                cached = self._cached
                if cached is None:
                    cached = self._cached = _runtime_settings(getattr(settings, "LEASING", None))
        return cached

    def __getattr__(self, name: str) -> Any:
        return getattr(self._load(), name)

    @property
    def current(self) -> LeasingSettings:
        return self._load()

    def reload(self) -> None:
        self._cached = None


leasing_settings = _LazySettings()


@receiver(setting_changed)
def _reload_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting == "LEASING":
        leasing_settings.reload()


def get_settings() -> LeasingSettings:
    """The current typed settings (read lazily, cached)."""
    return leasing_settings.current


# Every lease write, and every read that decides one, goes to this alias.
WRITE_DATABASE = DEFAULT_DB_ALIAS


def read_alias() -> str:
    """The alias the console reads from: `LEASING["READ_DATABASE"]`, else the default database.

    The one place the console, the admin querysets and `/metrics` learn where to
    read; an operator action re-reads on `WRITE_DATABASE` before it writes.
    """
    return leasing_settings.read_database or WRITE_DATABASE
