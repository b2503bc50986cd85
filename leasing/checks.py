"""System checks for the leasing app (ids `leasing.E0xx` and `leasing.W0xx`).

E001  settings.LEASING is not valid (per bad key, bad *_LIMITS entry, key spelt in two cases)
E002  the heartbeat interval is not below the lease (the default, or a work type's)
E003  the extender interval is not below its extension
E004  a SQLite database holding the leasing tables lacks the options the engine needs
E005  (leasing.tasks) a TASKS backend is LeasingBackend but 'leasing' is not installed
E006  an entry of LEASING["SCHEDULES"] is not valid (anything its ticks' enqueue would refuse)
E007  LEASING["READ_DATABASE"] names a database alias that DATABASES lacks
E008  USE_TZ is False
E009  LEASING["LISTEN_DATABASE"] names a database alias that DATABASES lacks, or one not PostgreSQL
E010  an entry of LEASING["HANDLERS"] cannot be loaded (its path, its options)
E011  a handler in process execution that a child process cannot import by its dotted path
E012  an entry of LEASING["RATE_LIMITS"] is not valid (its bucket, its rate or burst)
E013  (leasing.tasks) a LeasingBackend OPTIONS problem: an unknown DATABASE alias, a bad
      MAX_RETRIES, LEASE_DURATION or HEARTBEAT, an unknown option, OPTIONS not a dict, or a
      second leasing backend giving the django.task handler other values than the first
E014  a database leasing writes through (default, any holding its tables) has AUTOCOMMIT = False
W001  a database holding the leasing tables is not PostgreSQL
W002  the heartbeat can give up only after the lease expired
W003  the sweep interval is longer than the lease
W004  a heartbeat interval (the default or a work type's) is not below STALE_HEARTBEAT
W005  settings.LEASING sets a key this release no longer reads (RETRY_JITTER)
W006  a handler runs in process execution and PROCESS_STOP_GRACE is not below SHUTDOWN_TIMEOUT
W010  LEASING["TRACING"] is on but opentelemetry-api is not installed (nothing is traced)
W011  (leasing.tasks) a LeasingBackend's DATABASE is not the default (runworker --database ALIAS)
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections, router

from . import tracing
from .conf import RETIRED, WRITE_DATABASE, LeasingSettings, read_settings, retired_keys
from .exceptions import LeasingConfigurationError
from .handlers import HandlerSpec, registry
from .setting_entries import SettingProblem
from .storage import listens, storage_for

POSTGRES_ONLY_FEATURES = (
    "claims serialize on SQLite's single write lock instead of SKIP LOCKED, and idle "
    "workers poll instead of being woken by LISTEN/NOTIFY. That is fine for development "
    "and for a few workers on one host; workers on several hosts need PostgreSQL"
)

SQLITE_OPTIONS_SNIPPET = (
    '"OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30, '
    '"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}'
)


# The checks apply the rules the runtime applies (`conf.read_settings`, which the
# lazy settings use too), so a setting they accept never stops work at run time.
SETTINGS_HINT = (
    "Fix settings.LEASING; the keys and defaults are in the settings reference "
    "(docs/reference/settings.md)."
)
ENTRY_HINT = (
    "Fix or remove this entry. A process that runs without this check logs it once and "
    "skips it: the other entries apply."
)
TWICE_HINT = (
    "Keep one key per setting, spelt in upper case as in the settings reference "
    "(docs/reference/settings.md). A process that runs without this check logs this once "
    "and reads the last spelling."
)


def _read() -> tuple[LeasingSettings, tuple[SettingProblem, ...]]:
    return read_settings(getattr(settings, "LEASING", None))


@checks.register("leasing")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    conf, problems = _read()
    # Bad schedules are leasing.E006 (check_schedules), one error each.
    # Bad rate limits are leasing.E012, one error each.
    messages: list[checks.CheckMessage] = [
        checks.Error(problem.message, hint=_hint(problem), id="leasing.E001")
        for problem in problems
        if problem.setting not in ("SCHEDULES", "RATE_LIMITS") or problem.spelt_twice
    ]
    messages += [
        checks.Error(problem.message, hint=ENTRY_HINT, id="leasing.E012")
        for problem in problems
        if problem.setting == "RATE_LIMITS" and not problem.spelt_twice
    ]
    messages += [
        checks.Warning(
            f"LEASING[{key!r}] is no longer read: {RETIRED[key.upper()]}.",
            hint="Remove the key from settings.LEASING.",
            id="leasing.W005",
        )
        for key in retired_keys(getattr(settings, "LEASING", None))
    ]
    if any(not problem.entry for problem in problems):
        return messages  # a bad key stands at its default: the checks below would judge that

    if conf.heartbeat_interval >= conf.lease_duration:
        messages.append(
            checks.Error(
                f"LEASING['HEARTBEAT_INTERVAL'] ({conf.heartbeat_interval:g}s) must be below "
                f"LEASING['LEASE_DURATION'] ({conf.lease_duration:g}s): every lease would "
                "expire before its first renewal.",
                hint="Use about a tenth of the lease duration.",
                id="leasing.E002",
            )
        )
    elif conf.heartbeat_interval * conf.heartbeat_max_failures >= conf.lease_duration:
        messages.append(
            checks.Warning(
                f"HEARTBEAT_INTERVAL x HEARTBEAT_MAX_FAILURES "
                f"({conf.heartbeat_interval * conf.heartbeat_max_failures:g}s) is not below "
                f"LEASE_DURATION ({conf.lease_duration:g}s): the lease can expire before the "
                "heartbeat gives up, so a worker may notice the loss late.",
                hint="Shorten the heartbeat interval or lengthen the lease.",
                id="leasing.W002",
            )
        )
    specs, handler_messages = _handler_specs()
    messages += handler_messages
    messages += _type_heartbeats(conf, specs)
    messages += _process_execution(conf, specs)
    messages += _stale_between_renewals(conf, specs)
    if conf.sweep_interval > conf.lease_duration:
        messages.append(
            checks.Warning(
                f"LEASING['SWEEP_INTERVAL'] ({conf.sweep_interval:g}s) is longer than the lease "
                f"({conf.lease_duration:g}s): expired work waits up to a whole sweep interval "
                "before it is recovered.",
                hint="The rule of thumb is a fifth of the lease duration.",
                id="leasing.W003",
            )
        )
    if conf.tracing and not tracing.installed():
        messages.append(
            checks.Warning(
                "LEASING['TRACING'] is on but opentelemetry-api is not installed: work runs "
                "untraced and no trace context is stored with new items.",
                hint="pip install 'django-leasing[otel]' (and an OpenTelemetry SDK and "
                "exporter), or set LEASING['TRACING'] = False.",
                id="leasing.W010",
            )
        )
    known = ", ".join(repr(alias) for alias in settings.DATABASES) or "none"
    if conf.read_database is not None and conf.read_database not in settings.DATABASES:
        messages.append(
            checks.Error(
                f"LEASING['READ_DATABASE'] is {conf.read_database!r}, which is not a database "
                f"alias of DATABASES (aliases: {known}): every console page would fail.",
                hint="Name an alias of DATABASES (e.g. a streaming replica), or remove the key "
                "to read from the default database.",
                id="leasing.E007",
            )
        )
    if conf.listen_database is not None and conf.listen_database not in settings.DATABASES:
        messages.append(
            checks.Error(
                f"LEASING['LISTEN_DATABASE'] is {conf.listen_database!r}, which is not a "
                f"database alias of DATABASES (aliases: {known}): every PostgreSQL worker's "
                "NOTIFY listener would fail, leaving idle workers to poll.",
                hint="Name an alias of DATABASES (a direct connection, not a transaction "
                "pooler), or remove the key to listen on the worker's own database.",
                id="leasing.E009",
            )
        )
    # Only workers whose database can listen do (SQLite's poll): then the alias must too.
    listen = conf.listen_database
    if listen in settings.DATABASES and listens(WRITE_DATABASE) and not listens(listen):
        messages.append(
            checks.Error(
                f"LEASING['LISTEN_DATABASE'] is {listen!r}, whose database cannot LISTEN: "
                "every PostgreSQL worker's NOTIFY listener would fail, leaving idle workers "
                "to poll.",
                hint="Name a PostgreSQL alias (a direct connection, not a transaction pooler), "
                "or remove the key to listen on the worker's own database.",
                id="leasing.E009",
            )
        )
    if conf.extender_enabled and conf.extender_interval >= conf.extender_extension:
        messages.append(
            checks.Error(
                f"LEASING['EXTENDER_INTERVAL'] ({conf.extender_interval:g}s) must be below "
                f"LEASING['EXTENDER_EXTENSION'] ({conf.extender_extension:g}s), or a beating "
                "handler's lease can run out between two extensions.",
                id="leasing.E003",
            )
        )
    return messages


def _hint(problem: SettingProblem) -> str:
    if problem.spelt_twice:
        return TWICE_HINT
    return ENTRY_HINT if problem.entry else SETTINGS_HINT


def _process_execution(
    conf: LeasingSettings, specs: list[HandlerSpec]
) -> list[checks.CheckMessage]:
    """What would stop process execution (leasing.E011), or slow a worker's stop (W006)."""
    messages: list[checks.CheckMessage] = []
    in_children = any(spec.execution == "process" for spec in specs)
    if in_children and conf.process_stop_grace >= conf.shutdown_timeout:
        messages.append(
            checks.Warning(
                f"LEASING['PROCESS_STOP_GRACE'] ({conf.process_stop_grace:g}s) must be below "
                f"LEASING['SHUTDOWN_TIMEOUT'] ({conf.shutdown_timeout:g}s): a stopping worker "
                "takes up to SHUTDOWN_TIMEOUT plus twice the grace to stop a child that runs "
                "on, longer than its shutdown timeout says.",
                hint="A few seconds is enough for a handler to clean up after SIGTERM.",
                id="leasing.W006",
            )
        )
    for spec in specs:
        if spec.execution == "process" and not spec.importable():
            messages.append(
                checks.Error(
                    f"The handler of {spec.work_type!r} runs in a child process, which finds "
                    f"it by its dotted path {spec.dotted_path!r}, but that path does not lead "
                    "to it: every run would fail.",
                    hint="Define the handler at module level in an importable module.",
                    id="leasing.E011",
                )
            )
    return messages


def _type_heartbeats(conf: LeasingSettings, specs: list[HandlerSpec]) -> list[checks.CheckMessage]:
    """leasing.E002 for each work type whose own lease or heartbeat interval, paired with
    the default other one, leaves the interval not below the lease: the worker resolves
    them so (`worker.options.resolve`) and refuses to start, stopping every queue."""
    messages: list[checks.CheckMessage] = []
    for spec in specs:
        if spec.lease_duration is None and spec.heartbeat_interval is None:
            continue  # the defaults: judged above
        lease = spec.lease_duration or conf.lease_duration
        interval = spec.heartbeat_interval or conf.heartbeat_interval
        if interval < lease:
            continue
        lease_from = "its lease_duration" if spec.lease_duration else "LEASING['LEASE_DURATION']"
        interval_from = (
            "its heartbeat_interval" if spec.heartbeat_interval else "LEASING['HEARTBEAT_INTERVAL']"
        )
        messages.append(
            checks.Error(
                f"Work type {spec.work_type!r}: the heartbeat interval ({interval:g}s, "
                f"{interval_from}) must be below the lease ({lease:g}s, {lease_from}): every "
                "lease of the type would expire before its first renewal, and runworker "
                "refuses to start.",
                hint="Give the type a heartbeat_interval of about a tenth of its lease "
                "(in LEASING['HANDLERS'] or @leasing.handler), or a longer lease_duration "
                "(for 'django.task': the TASKS backend's OPTIONS LEASE_DURATION).",
                id="leasing.E002",
            )
        )
    return messages


def _handler_specs() -> tuple[list[HandlerSpec], list[checks.CheckMessage]]:
    """The registered handlers, or the error of the first LEASING['HANDLERS'] entry that
    cannot be loaded: every enqueue and every worker would raise it."""
    try:
        return registry.specs(), []
    except LeasingConfigurationError as exc:
        error = checks.Error(
            str(exc),
            hint="Fix the entry: a dotted path to a synchronous callable, or a dict with a "
            "'handler' dotted path and the options of @leasing.handler.",
            id="leasing.E010",
        )
        return [], [error]


def _stale_between_renewals(
    conf: LeasingSettings, specs: list[HandlerSpec]
) -> list[checks.CheckMessage]:
    """The heartbeat intervals (the default and each work type's) not below STALE_HEARTBEAT.

    A lease is renewed on its own type's interval, so the console, which calls
    a heartbeat older than STALE_HEARTBEAT stale, would flag such leases while
    they are healthy.
    """
    intervals = {"LEASING['HEARTBEAT_INTERVAL']": conf.heartbeat_interval}
    for spec in specs:
        if spec.heartbeat_interval is not None:
            intervals[f"work type {spec.work_type!r}"] = spec.heartbeat_interval
    late = [
        f"{name} ({seconds:g}s)"
        for name, seconds in intervals.items()
        if seconds >= conf.stale_heartbeat
    ]
    if not late:
        return []
    return [
        checks.Warning(
            f"The heartbeat interval of {', '.join(late)} is not below "
            f"LEASING['STALE_HEARTBEAT'] ({conf.stale_heartbeat:g}s): the console would call "
            "those leases stale between two renewals while they are healthy.",
            hint="Shorten the interval, or set STALE_HEARTBEAT to a few intervals.",
            id="leasing.W004",
        )
    ]


@checks.register("leasing")
def check_time_zone(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Lease times come from the database clock as aware UTC datetimes; with
    USE_TZ off the ORM hands out naive ones, and comparing the two fails."""
    if getattr(settings, "USE_TZ", True):
        return []
    return [
        checks.Error(
            "The leasing app needs USE_TZ = True: lease times are aware UTC datetimes "
            "read from the database clock, and with USE_TZ = False the ORM returns naive "
            "ones, so the console and the engine would fail comparing them.",
            hint="Set USE_TZ = True (Django's default since 5.0).",
            id="leasing.E008",
        )
    ]


@checks.register("leasing")
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    conf, problems = _read()
    hint = "See docs/how-to/schedules.md for the keys and an example."
    messages: list[checks.CheckMessage] = [
        checks.Error(problem.message, hint=hint, id="leasing.E006")
        for problem in problems
        if problem.setting == "SCHEDULES" and not problem.spelt_twice
    ]
    if conf.allow_unregistered_types or any(not problem.entry for problem in problems):
        return messages
    for spec in conf.schedules.values():
        try:
            registered = spec.work_type in registry
        except LeasingConfigurationError:
            continue  # a bad LEASING['HANDLERS'] entry: leasing.E010 says which
        if not registered:
            messages.append(
                checks.Error(
                    f"LEASING['SCHEDULES']: schedule {spec.name!r}: no handler is registered "
                    f"for work type {spec.work_type!r}, so the enqueue would refuse every "
                    "tick's item.",
                    hint="Register a handler for it (@leasing.handler), or set "
                    "LEASING['ALLOW_UNREGISTERED_TYPES'] = True where another process runs it.",
                    id="leasing.E006",
                )
            )
    return messages


def _leasing_aliases() -> list[str]:
    """The database aliases that may hold the leasing tables (by the routers)."""
    from .models import WorkItem

    return [alias for alias in connections if router.allow_migrate_model(alias, WorkItem)]


@checks.register("leasing")
def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    # Reads only the configured settings, so it needs no connection and runs
    # with every command, not just `check --database`.
    messages: list[checks.CheckMessage] = []
    for alias in _leasing_aliases():
        database = connections[alias].display_name
        try:
            storage = storage_for(alias)
        except LeasingConfigurationError:
            storage = None  # a database leasing cannot run on: the warning below says so
        if storage is not None:
            problems = storage.option_problems()
            if problems:
                messages.append(
                    checks.Error(
                        f"SQLite database {alias!r} is not set up for leasing workers; it "
                        f"needs {'; '.join(problems)}. With Django's default SQLite settings "
                        "two workers fail items and leave leases behind.",
                        hint=f"Add to DATABASES[{alias!r}]: {SQLITE_OPTIONS_SNIPPET}",
                        id="leasing.E004",
                    )
                )
        if storage is None or not storage.serves_many_hosts:
            messages.append(
                checks.Warning(
                    f"Database {alias!r} is {database}, not PostgreSQL: {POSTGRES_ONLY_FEATURES}.",
                    hint=(
                        "For production use PostgreSQL (pip install 'django-leasing[postgres]'). "
                        "If one host is all you need, silence this warning with "
                        'SILENCED_SYSTEM_CHECKS = ["leasing.W001"].'
                    ),
                    id="leasing.W001",
                )
            )
    return messages


@checks.register("leasing")
def check_autocommit(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every lease write commits by itself (or in an atomic block of its own); with
    AUTOCOMMIT = False nothing a worker writes is ever committed: PostgreSQL rolls it
    all back when the connection closes, SQLite holds its write lock until then.

    The default database (where lease writes go) and every alias the routers let
    hold the leasing tables (`runworker --database`). The NOTIFY listener opens a
    connection of its own in autocommit, and the read database only reads.
    """
    aliases = dict.fromkeys([WRITE_DATABASE, *_leasing_aliases()])
    return [
        checks.Error(
            f"DATABASES[{alias!r}] sets AUTOCOMMIT = False: leasing commits each write "
            "itself, so no claim, heartbeat or result a worker writes would ever be "
            "committed (PostgreSQL rolls them back, SQLite keeps its write lock), and every "
            "item would run again.",
            hint=f"Remove 'AUTOCOMMIT' from DATABASES[{alias!r}] (Django's default is True).",
            id="leasing.E014",
        )
        for alias in aliases
        if alias in settings.DATABASES and not settings.DATABASES[alias].get("AUTOCOMMIT", True)
    ]
