"""Fixtures of the HA tests: root, Debian's PostgreSQL tools, pgbouncer and `ip netns`.

These tests build real clusters, a pooler and network namespaces; `make test-ha`
runs them (the ordinary `make test` does not collect this directory). Missing
tools are an error, never a skip: a run without them proves nothing. Whatever
a test creates is removed when it ends, and anything a crashed earlier run
left behind (clusters `lha_*`, namespaces `lha-*`, the bridge, pgbouncers) is
removed before the first test and after the last.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from .clusters import drop_leftovers
from .helpers import ARTIFACTS
from .network import cleanup_network
from .pooler import kill_leftover_pgbouncers
from .processes import Fleet, base_env

HERE = Path(__file__).resolve().parent
REQUIRED_TOOLS = (
    "pg_createcluster",
    "pg_ctlcluster",
    "pg_basebackup",
    "pgbouncer",
    "ip",
    "tc",
    "runuser",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.ha)


def cleanup_everything() -> None:
    kill_leftover_pgbouncers()
    drop_leftovers()
    cleanup_network()


@pytest.fixture(scope="session", autouse=True)
def ha_machine() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.fail(
            "the HA tests need root (clusters, namespaces, pgbouncer); run make test-ha as root"
        )
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"missing tools: {', '.join(missing)}; run scripts/ha/ensure-packages.sh")
    cleanup_everything()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield
    finally:
        cleanup_everything()


@pytest.fixture
def fleet(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Processes of one test; all killed at teardown, logs kept under artifacts/ha/<test>/."""
    run_dir = ARTIFACTS / request.node.name
    shutil.rmtree(run_dir, ignore_errors=True)
    fleet = Fleet(run_dir, base_env())
    try:
        yield fleet
    finally:
        fleet.kill_all()
