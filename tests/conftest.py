"""Shared fixtures.

The suite runs twice (see the Makefile): once on SQLite and once on
PostgreSQL. Tests marked `postgres` are skipped on the SQLite run only; when
`LEASING_REQUIRE_POSTGRES=1` (the PostgreSQL run of `make test`) a
non-PostgreSQL database aborts the run instead of letting it pass skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import OperationalError, connection, connections

from tests.support.helpers import ROOT, database_url, run_in_threads

# tests/ha builds clusters, a pooler and network namespaces as root: only
# `make test-ha` (LEASING_HA_TESTS=1) collects it.
collect_ignore = [] if os.environ.get("LEASING_HA_TESTS") == "1" else ["ha"]
# tests/faults runs processes on a throwaway cluster under faults for minutes: only
# `make test-faults` (LEASING_FAULT_TESTS=1) collects it.
if os.environ.get("LEASING_FAULT_TESTS") != "1":
    collect_ignore.append("faults")
# The benchmark smoke run (every scenario at small sizes, 2-5 minutes) has its
# own target, `make test-bench-smoke` (LEASING_BENCH_SMOKE=1), which CI runs
# after `make test`; that keeps `make test` under 15 minutes.
if os.environ.get("LEASING_BENCH_SMOKE") != "1":
    collect_ignore.append("bench")


def _vendor() -> str:
    return connections["default"].vendor


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The longest files first: pytest-xdist hands files out in this order.
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
    vendor = _vendor()
    if os.environ.get("LEASING_REQUIRE_POSTGRES") == "1" and vendor != "postgresql":
        raise pytest.UsageError(
            f"LEASING_REQUIRE_POSTGRES=1 but DATABASE_URL points at {vendor}; "
            "the PostgreSQL run must not pass with its tests skipped."
        )
    if vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (runs in the PostgreSQL pass of make test)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> None:
    """The test database, with the state machine's guard (tests/support/transition_guard.py)."""
    from tests.support import transition_guard

    with django_db_blocker.unblock():
        transition_guard.install()


@pytest.fixture(autouse=True)
def _declared_transitions_only(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test in which any statement moved a work item outside `leasing.transitions`."""
    marker = request.node.get_closest_marker("django_db")
    uses_db = marker is not None or {"db", "transactional_db"} & set(request.fixturenames)
    if not uses_db or "ha" in request.node.keywords:
        yield
        return
    transactional = bool(marker and marker.kwargs.get("transaction")) or (
        "transactional_db" in request.fixturenames
    )
    request.getfixturevalue("transactional_db" if transactional else "db")
    from tests.support import transition_guard

    transition_guard.clear()
    yield
    try:
        found = transition_guard.violations()
    except OperationalError:  # the test pointed the connection at a dead server
        connection.close()
        return
    if found:
        pytest.fail(
            "statements moved work items in ways leasing.transitions does not declare: "
            + ", ".join(f"{move} ({item})" for move, item in found[:10]),
            pytrace=False,
        )


@pytest.fixture
def vendor() -> str:
    return _vendor()


@pytest.fixture
def is_postgres() -> bool:
    return _vendor() == "postgresql"


@pytest.fixture
def leasing_settings(settings: Any) -> Callable[..., None]:
    """Override keys of settings.LEASING for one test: leasing_settings(LEASE_DURATION=2)."""

    def apply(**overrides: Any) -> None:
        settings.LEASING = {**getattr(settings, "LEASING", {}), **overrides}

    return apply


@pytest.fixture
def make_items(db: None) -> Callable[..., list[Any]]:
    """Enqueue n items: make_items(3, work_type="noop", priority=1)."""
    from leasing import enqueue_many

    def make(n: int = 1, *, task_id: str | None = None, **fields: Any) -> list[Any]:
        specs = []
        for index in range(n):
            spec = {"task_id": task_id or f"task-{index}", "work_type": "noop", **fields}
            specs.append(spec)
        return enqueue_many(specs)

    return make


@pytest.fixture
def threads() -> Callable[[int, Callable[[int], Any]], list[Any]]:
    return run_in_threads


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for a subprocess that uses the test database."""
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url()
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def spawn(subprocess_env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start Python subprocesses on the test database; kill leftovers at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def start(
        *args: str, env: dict[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env={**subprocess_env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **kwargs,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()


# --- the admin tests' scenario and clients (tests/support/admin.py) ----------------


@pytest.fixture
def scenario(db: None) -> Any:
    """One item in each lease health and status (`lease_scenario()`)."""
    from tests.support.admin import lease_scenario

    return lease_scenario()


@pytest.fixture
def operator_client(db: None) -> Any:
    """A staff user who may view everything and force-release (no payloads)."""
    return _admin_client("operator", "leasing.force_release_workitem")


@pytest.fixture
def viewer_client(db: None) -> Any:
    """A staff user who may only view (no payloads)."""
    return _admin_client("viewer")


def _admin_client(username: str, *extra_perms: str) -> Any:
    from django.test import Client

    from tests.support.admin import VIEW_ALL, make_user

    client = Client()
    client.force_login(make_user(username, *VIEW_ALL, *extra_perms))
    return client


@pytest.fixture
def tasks_setting(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Set TASKS (one leasing backend per keyword, in order) and start the app again."""
    import django.tasks
    from django.apps import apps
    from django.tasks import TaskBackendHandler

    from leasing.handlers import registry
    from leasing.tasks import BACKEND_PATH, TASK_WORK_TYPE, run_task

    def apply(**backends: Any) -> None:
        # A handler of its own first: Django resets `django.tasks.task_backends` when TASKS
        # changes, and would give the project's handler this test's TASKS for good.
        monkeypatch.setattr(django.tasks, "task_backends", TaskBackendHandler())
        settings.TASKS = {
            alias: {"BACKEND": BACKEND_PATH, "QUEUES": [], "OPTIONS": options}
            for alias, options in backends.items()
        }
        apps.get_app_config("leasing").ready()

    yield apply
    registry.register(TASK_WORK_TYPE, run_task, replace=True)  # as the project's TASKS
