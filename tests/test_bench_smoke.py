"""Smoke test of the benchmark suite (GitHub issue 6).

Speed is proven by `python -m bench.run` (`make bench`), which prints its
figures; no test here asserts a speed. This test only checks that the quick
version of every scenario runs against the PostgreSQL server of the test
database (in its own database, `leasing_bench_smoke`) and reports sane
numbers: every item drained, positive rates, latencies that are numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from bench.run import SCENARIOS
from tests.conftest import ROOT, database_url

pytestmark = pytest.mark.postgres


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


def test_quick_bench_reports_every_scenario() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--quick",
            "--database",
            "leasing_bench_smoke",
            "--database-url",
            database_url(),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    records = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            records[record["scenario"]] = record
    assert set(records) == {"machine", *SCENARIOS}, sorted(records)
    assert all("error" not in r for r in records.values())

    machine = records["machine"]
    assert machine["nproc"] >= 1
    assert machine["postgresql"]
    assert machine["pg_settings"]["synchronous_commit"]

    enqueue = records["enqueue"]
    assert enqueue["items"] > 0 and _positive(enqueue["seconds"])

    for name in ("throughput", "ceiling", "options"):
        runs = records[name]["runs"]
        assert runs, name
        for run in runs:
            assert run["completed"] == run["items"] > 0, (name, run)
            assert run["claimed_more_than_once"] == 0, (name, run)
            assert _positive(run["jobs_per_s"]) and _positive(run["wall_jobs_per_s"]), run
    ratios = [r.get("ratio_runworker_to_ceiling") for r in records["ceiling"]["runs"]]
    assert all(_positive(r) for r in ratios), ratios

    for run in records["claim"]["runs"]:
        assert run["claim_ms"]["n"] > 0 and _positive(run["claim_ms"]["p99"]), run
        assert _positive(run["server_explain_ms_fresh_backlog"]["execution_ms"]), run

    for run in records["pickup"]["runs"]:
        assert run["items"] > 0 and _positive(run["pickup_ms"]["p50"]), run

    recovery = records["recovery"]
    assert recovery["kill_to_reclaim_s"]["n"] == recovery["items"] * recovery["rounds"]
    assert _positive(recovery["kill_to_reclaim_s"]["min"])

    for run in records["sweep"]["runs"]:
        assert "timed_out_after_s" not in run, run
        assert run["expired"] > 0 and _positive(run["wall_ms"]), run
        with_checkpoints = run["variant"] == "as migrated"
        assert run["checkpoints_created"] == (run["expired"] if with_checkpoints else 0), run

    for variant in ("as_migrated", "worker_renewer"):
        heartbeat = records["heartbeat"][variant]
        assert heartbeat["lost"] == 0 and _positive(heartbeat["renewals_per_s"]), heartbeat
        assert heartbeat["hot_share"] is not None
    # The worker's renewer keeps the indexed expiry while half the lease is
    # left, so PostgreSQL can apply most of its renewals as HOT updates.
    assert records["heartbeat"]["worker_renewer"]["hot_share"] > 0.5

    assert elapsed < 60, f"the quick benchmark took {elapsed:.0f}s"
