"""System checks for the leasing app (ids `leasing.E0xx` and `leasing.W0xx`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections

from .conf import build_settings
from .exceptions import LeasingConfigurationError

POSTGRES_ONLY_FEATURES = (
    "claims serialize on SQLite's single write lock instead of SKIP LOCKED, "
    "so workers on several hosts cannot share it; idle workers poll instead of "
    "being woken by LISTEN/NOTIFY"
)


@checks.register("leasing")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        conf = build_settings(getattr(settings, "LEASING", None))
    except LeasingConfigurationError as exc:
        return [
            checks.Error(
                str(exc),
                hint="Fix settings.LEASING; the keys and defaults are in README.md.",
                id="leasing.E001",
            )
        ]

    messages: list[checks.CheckMessage] = []
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


@checks.register("leasing")
def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    # Reads only the configured ENGINE, so it needs no connection and runs with
    # every command, not just `check --database`.
    if settings.DEBUG:
        return []
    messages: list[checks.CheckMessage] = []
    for alias in connections:
        vendor = connections[alias].vendor
        if vendor != "postgresql":
            messages.append(
                checks.Warning(
                    f"Database {alias!r} is {vendor}, not PostgreSQL: {POSTGRES_ONLY_FEATURES}.",
                    hint="Set DATABASE_URL to a PostgreSQL server for production.",
                    id="leasing.W001",
                )
            )
    return messages
