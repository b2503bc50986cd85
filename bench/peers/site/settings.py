"""Settings of the peers' Django site (run from the peers' virtualenv only).

Each peer is configured as its documentation shows, with its defaults:
procrastinate through `procrastinate.contrib.django`, django-tasks-db as the
default `TASKS` backend, django-q2 with its ORM broker. `BENCH_PEER_DATABASE_URL`
names the database; `BENCH_PEER_WORKERS` is django-q2's worker count.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

_url = urlsplit(os.environ.get("BENCH_PEER_DATABASE_URL", "postgresql://postgres@127.0.0.1/x"))

SECRET_KEY = "bench-peers-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "procrastinate.contrib.django",
    "django_tasks_db",
    "django_q",
    "bench.peers.site",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "postgres",
        "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": str(_url.port or 5432),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
Q_CLUSTER = {
    "name": "bench",
    "orm": "default",
    "workers": int(os.environ.get("BENCH_PEER_WORKERS", "1")),
}
