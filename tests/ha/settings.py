"""Django settings for the HA tests' worker, sweep and helper processes.

The fixtures describe the database topology through the environment:

- `HA_DB_HOST`, `HA_DB_PORT`: one address, or comma-separated lists for a
  multi-host connection (libpq tries them in order and, with
  `target_session_attrs=read-write`, keeps the one that accepts writes);
- `HA_DB_NAME`; `HA_DB_POOLED=1` when the address is a transaction pooler;
- `HA_DIRECT_HOST`, `HA_DIRECT_PORT`: a direct (unpooled) address for the
  `direct` alias, which the NOTIFY listener uses (`LEASING["LISTEN_DATABASE"]`);
- `HA_REPLICA_HOST`, `HA_REPLICA_PORT`: a streaming replica for the `replica` alias;
- `HA_LEASING`: JSON of `LEASING` keys for this run;
- `HA_TCP_TIMEOUT_MS`: how long an unanswered connection may hang before the
  driver gives up (libpq's `connect_timeout` and `tcp_user_timeout`).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal

from project.settings import *  # noqa: F403

# A process the tests have to kill prints every thread's stack first (the
# fleet sends SIGUSR2 before SIGKILL), so a hang says where it hung.
faulthandler.register(signal.SIGUSR2, all_threads=True)

INSTALLED_APPS = [*INSTALLED_APPS, "tests.ha.app"]  # noqa: F405
# The console probe (ha_console_probe) uses Django's test client.
ALLOWED_HOSTS = [*ALLOWED_HOSTS, "testserver"]  # noqa: F405

_TIMEOUT_MS = int(os.environ.get("HA_TCP_TIMEOUT_MS", "3000"))


def _database(host: str, port: str, *, pooled: bool) -> dict:
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("HA_DB_NAME", "leasing_ha"),
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": host,
        "PORT": port,
        # A pooled connection is cheap to reopen; a direct one is kept.
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        # A transaction pooler hands each transaction to any server connection:
        # a server-side cursor (QuerySet.iterator()) would not survive it.
        "DISABLE_SERVER_SIDE_CURSORS": pooled,
        "OPTIONS": {
            # With several hosts: connect to whichever accepts writes (the primary).
            "target_session_attrs": "read-write",
            "connect_timeout": max(1, _TIMEOUT_MS // 1000),
            # A partitioned host must notice a dead peer in seconds, not the
            # kernel's default 15 minutes of retransmissions.
            "tcp_user_timeout": _TIMEOUT_MS,
            "keepalives": 1,
            "keepalives_idle": max(1, _TIMEOUT_MS // 1000),
            "keepalives_interval": 1,
            "keepalives_count": 3,
        },
        "TEST": {"NAME": None},
    }


DATABASES = {
    "default": _database(
        os.environ.get("HA_DB_HOST", "127.0.0.1"),
        os.environ.get("HA_DB_PORT", "5432"),
        pooled=os.environ.get("HA_DB_POOLED") == "1",
    )
}
if os.environ.get("HA_DIRECT_PORT"):
    DATABASES["direct"] = _database(
        os.environ.get("HA_DIRECT_HOST", "127.0.0.1"), os.environ["HA_DIRECT_PORT"], pooled=False
    )

if os.environ.get("HA_REPLICA_PORT"):
    # A streaming replica: read-only, for the console (LEASING["READ_DATABASE"]).
    DATABASES["replica"] = _database(
        os.environ.get("HA_REPLICA_HOST", "127.0.0.1"), os.environ["HA_REPLICA_PORT"], pooled=False
    )
    DATABASES["replica"]["OPTIONS"]["target_session_attrs"] = "any"

LEASING = json.loads(os.environ.get("HA_LEASING", "{}"))

# Each process's log file gets the `leasing` warnings (LEASING_LOG_LEVEL=INFO or
# DEBUG for more); project.settings configures these loggers only when that
# variable is set, and runworker would otherwise log INFO by itself.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "leasing": {
            "handlers": ["console"],
            "level": os.environ.get("LEASING_LOG_LEVEL", "WARNING"),
            "propagate": False,
        },
    },
}
