"""A site that installed `django-leasing` without any extra, in one process.

The optional packages (psycopg, django-q2, cronsim, prometheus-client, dj-database-url)
are made unimportable before Django starts; then every module of the app is
imported, the system checks run and the metrics renderer is asked for its
text. Prints one JSON line: {"imported": [...], "errors": [...],
"check_ids": [...], "metrics": "<the MetricsUnavailable message>"}.

Usage: python -m tests.procs.without_extras SQLITE_PATH
"""

from __future__ import annotations

import importlib
import importlib.abc
import json
import pkgutil
import sys
from typing import Any

OPTIONAL = (
    "psycopg",
    "psycopg2",
    "django_q",
    "prometheus_client",
    "dj_database_url",
    "cronsim",
    "opentelemetry",
)


class BlockOptional(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.split(".")[0] in OPTIONAL:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)
        return None


def main() -> None:
    sys.meta_path.insert(0, BlockOptional())
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="without-extras",
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "leasing",
        ],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": sys.argv[1],
                "OPTIONS": {
                    "transaction_mode": "IMMEDIATE",
                    "timeout": 30,
                    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                },
            }
        },
        ROOT_URLCONF="leasing.urls",
        USE_TZ=True,
    )
    django.setup()
    import leasing

    imported, errors = [], []
    for module in pkgutil.walk_packages(leasing.__path__, "leasing."):
        try:
            importlib.import_module(module.name)
        except Exception as exc:
            errors.append(f"{module.name}: {type(exc).__name__}: {exc}")
        else:
            imported.append(module.name)

    from django.core import checks

    check_ids = [message.id for message in checks.run_checks()]

    from leasing.metrics import MetricsUnavailable, render_latest

    try:
        render_latest()
    except MetricsUnavailable as exc:
        metrics = str(exc)
    else:
        metrics = "rendered"
    print(
        json.dumps(
            {"imported": imported, "errors": errors, "check_ids": check_ids, "metrics": metrics}
        )
    )


if __name__ == "__main__":
    main()
