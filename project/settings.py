"""Settings of the Leasing demo site and test project.

Everything that differs between machines comes from the environment:
`DATABASE_URL` (default: SQLite file `db.sqlite3`), `SECRET_KEY`, `DEBUG`,
`ALLOWED_HOSTS`.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = _env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY", "django-insecure-leasing-local-development-only")
ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
    if h.strip()
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "leasing",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database_from_url(url: str) -> dict:
    config = dj_database_url.parse(url, conn_max_age=int(os.environ.get("CONN_MAX_AGE", "60")))
    config["CONN_HEALTH_CHECKS"] = True
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # IMMEDIATE transactions take the write lock up front, so two writers
        # queue on the busy timeout instead of failing with "database is locked"
        # when a read lock cannot be upgraded; WAL lets readers run beside them.
        config["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        # A file (not :memory:) so that threads and worker subprocesses of the
        # tests share one database; beside the configured one, so that test
        # runs against different database files never share theirs.
        config["TEST"] = {"NAME": os.environ.get("SQLITE_TEST_NAME", f"{config['NAME']}-test")}
    return config


DATABASES = {
    "default": _database_from_url(
        os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}")
    )
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGIN_URL = "admin:login"

# The app's own settings (README.md, "Settings"); every key is optional.
LEASING: dict = {}

# Django's Tasks framework runs @task functions on leasing workers. An empty
# QUEUES list accepts any queue name.
TASKS = {
    "default": {
        "BACKEND": "leasing.tasks.LeasingBackend",
        "QUEUES": [],
    }
}

# django-q2: only used when the sweep is scheduled with `recoverysweep --schedule`.
Q_CLUSTER = {
    "name": "leasing",
    "orm": "default",
    "workers": 1,
    "timeout": 300,
    "retry": 360,
    "catch_up": False,
}

# runworker and recoverysweep log to stderr by themselves when LOGGING leaves
# the `leasing` loggers alone: INFO (start, stop, summaries, retries, failures,
# sweep passes), one line per completed item with -v 2, warnings only with -v 0.
# LEASING_LOG_LEVEL=DEBUG|INFO|... hands the decision to this LOGGING instead.
LOGGING: dict = {"version": 1, "disable_existing_loggers": False}
_LOG_LEVEL = os.environ.get("LEASING_LOG_LEVEL", "").strip().upper()
if _LOG_LEVEL:
    # Read case-insensitively (and a number as one); anything else fails here in one line
    # rather than as a traceback out of logging.config when Django sets up logging.
    _LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    if not _LOG_LEVEL.isdigit() and _LOG_LEVEL not in _LEVELS:
        raise ImproperlyConfigured(
            f"LEASING_LOG_LEVEL must be one of {', '.join(_LEVELS)} or a number, "
            f"got {os.environ['LEASING_LOG_LEVEL']!r}."
        )
    LOGGING |= {
        "formatters": {
            "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        },
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "plain"},
        },
        "loggers": {
            "leasing": {
                "handlers": ["console"],
                "level": int(_LOG_LEVEL) if _LOG_LEVEL.isdigit() else _LOG_LEVEL,
                "propagate": False,
            },
        },
    }
