"""The fault run (`make test-faults`): root, Debian's PostgreSQL tools and pgbouncer.

Collected only with LEASING_FAULT_TESTS=1 (tests/conftest.py). Missing tools
are an error, never a skip: a run without them proves nothing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# The run's cluster and pgbouncer are named apart from the HA suite's (`lfx_`, its own
# ports; tests/ha/clusters.py OWNERS), so .ci/run can run the two at once. Set before
# the test module imports tests.ha.clusters, which reads it.
os.environ["LEASING_CLUSTER_OWNER"] = "faults"

HERE = Path(__file__).resolve().parent
REQUIRED_TOOLS = ("pg_createcluster", "pg_ctlcluster", "pgbouncer", "runuser")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.faults)


@pytest.fixture(scope="session", autouse=True)
def fault_machine() -> None:
    if os.geteuid() != 0:
        pytest.fail("the fault run needs root (a cluster and pgbouncer); run make test-faults")
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"missing tools: {', '.join(missing)}; run scripts/ha/ensure-packages.sh")
    from tests.ha.clusters import PREFIX

    if PREFIX != "lfx_":
        pytest.fail(
            f"the fault run's clusters would be named {PREFIX}*, like the HA suite's: "
            "run it apart from tests/ha (make test-faults)"
        )
