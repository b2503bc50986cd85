"""Smoke tests of the benchmark suite.

Speed is proven by `python -m bench.run` (`make bench`), which prints its
figures; no test here asserts a speed. These tests only check that the quick
version of every scenario runs against the PostgreSQL server of the test
database (in its own database, named after the test database so that
worktrees sharing a server never drop each other's) and reports sane
numbers: every item drained, positive rates, latencies that are numbers, each
target reported as met or missed. One quick run covers every scenario (the
machine's probes and the database's setup once); the scenarios with a test of
their own read its records. The first run builds the peers' virtualenv from
PyPI (bench/requirements-peers.txt).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from bench.run import SCENARIOS
from bench.scenarios.sweep import AS_MIGRATED, HISTORY, WHOLE_TABLE
from tests.support.helpers import ROOT, database_url

pytestmark = pytest.mark.postgres


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


def _quick_bench(only: tuple[str, ...], timeout_s: float) -> dict[str, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--quick",
            "--only",
            ",".join(only),
            "--database",
            f"{urlsplit(database_url()).path.lstrip('/') or 'leasing'}_bench_smoke",
            "--database-url",
            database_url(),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    records = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            records[record["scenario"]] = record
    assert set(records) == {"machine", *only}, sorted(records)
    assert all("error" not in r for r in records.values())
    # The table names every scenario's targets with a status.
    assert "metric" in proc.stdout and ("met" in proc.stdout or "MISSED" in proc.stdout)
    return records


@pytest.fixture(scope="module")
def quick_run() -> tuple[dict[str, dict[str, Any]], float]:
    """The records of one quick run of every scenario, and how long it took."""
    started = time.monotonic()
    records = _quick_bench(SCENARIOS, timeout_s=1800)
    return records, time.monotonic() - started


def _drained(run: dict[str, Any]) -> None:
    assert run["completed"] == run["items"] > 0, run
    assert run["claimed_more_than_once"] == 0, run
    assert _positive(run["jobs_per_s"]) and _positive(run["wall_jobs_per_s"]), run


def _costed(run: dict[str, Any]) -> None:
    assert _positive(run["client_cpu_us_per_job"]) and _positive(run["xact_per_job"]), run


def test_quick_bench_reports_every_scenario(quick_run) -> None:
    records, elapsed = quick_run

    machine = records["machine"]
    assert machine["nproc"] >= 1
    assert machine["postgresql"]
    assert machine["pg_settings"]["synchronous_commit"]
    assert _positive(machine["raw_loop_probe"]["jobs_per_s"])
    commit = machine["commit_probe"]
    assert commit["n"] == 1_000 and 0 < commit["p50"] <= commit["p99"] <= commit["max"], commit
    wake = machine["wake_probe"]
    for name in ("back_to_back", "after_5ms_idle"):
        figures = wake[name]
        assert figures["n"] == machine["sizes"]["wake_probes"], wake
        assert 0 < figures["p50"] <= figures["p99"], wake

    enqueue = records["enqueue"]
    assert enqueue["items"] > 0 and _positive(enqueue["seconds"])

    throughput = records["throughput"]
    for run in throughput["runs"] + throughput["warning_runs"]:
        _drained(run)
        _costed(run)
    assert throughput["warning_runs"] and set(throughput["logging_cost"])
    assert isinstance(throughput["logging_cost_met"], bool)
    # At the target's process count the two levels alternate; the cost is of their medians.
    drains = throughput["logging_drains"]
    assert drains["workers"] == throughput["logging_cost_at"]
    assert len(drains["default"]) == len(drains["warning"]) == 2
    # Their client CPU too, a figure each: the steady scenario's reference is their median.
    assert len(drains["default_cpu_us_per_job"]) == 2
    assert all(_positive(cpu) for cpu in drains["default_cpu_us_per_job"]), drains
    at = drains["workers"]
    expected = 1 - statistics.median(drains["default"]) / statistics.median(drains["warning"])
    assert throughput["logging_cost"][str(at)] == round(expected, 3)  # JSON keys are text

    ceiling = records["ceiling"]
    assert {r["batch"] for r in ceiling["runs"]} == {1, 10, 100}
    # The loops are a fair bar only while they walk one of the engine's claim
    # indexes (the loop's claim names one work type, so the type-led one fits too).
    claim_indexes = {"work_items_claim_idx", "work_items_claim_type_idx"}
    assert claim_indexes & set(ceiling["claim_plan_indexes"]), ceiling["claim_plan_indexes"]
    for run in ceiling["runs"]:
        _drained(run)
        _costed(run)
        assert _positive(run["ratio_runworker_to_ceiling"]), run
    # Each claim statement takes up to K rows and commits once, so the batched
    # loop commits far less than once a job.
    k100 = [r for r in ceiling["runs"] if r["batch"] == 100]
    assert all(r["xact_per_job"] < 0.5 for r in k100), k100
    # Where runworker's drains alternate, the batched loop drains as often and
    # the ratio is of the two medians.
    [repeated] = [r for r in k100 if r["workers"] == at]
    assert repeated["runworker_jobs_per_s_runs"] == drains["default"]
    assert len(repeated["loop_jobs_per_s_runs"]) == 2
    assert repeated["loop_jobs_per_s_runs"][0] == repeated["jobs_per_s"]
    expected = statistics.median(drains["default"]) / statistics.median(
        repeated["loop_jobs_per_s_runs"]
    )
    assert repeated["ratio_runworker_to_ceiling"] == round(expected, 3)
    # The same K = 100 loop over the minimal queue table, at the same process counts.
    minimal = ceiling["minimal_runs"]
    assert {r["workers"] for r in minimal} == {r["workers"] for r in k100}, minimal
    for run in minimal:
        assert run["batch"] == 100 and run["completed"] == run["items"] > 0, run
        assert _positive(run["jobs_per_s"]) and _positive(run["wall_jobs_per_s"]), run
        _costed(run)
        assert _positive(run["ratio_runworker_to_ceiling"]), run
    [repeated] = [r for r in minimal if r["workers"] == at]
    expected = statistics.median(drains["default"]) / statistics.median(
        repeated["loop_jobs_per_s_runs"]
    )
    assert repeated["ratio_runworker_to_ceiling"] == round(expected, 3)

    for run in records["options"]["runs"]:
        _drained(run)

    signals = records["signals"]
    for run in signals["without_receivers"] + signals["with_receivers"]:
        _drained(run)
    listened = signals["items"] * signals["repeats"]
    # The receivers really listened: every item was acquired and released once.
    assert signals["signals_received"].get("lease_acquired") == listened, signals
    assert signals["signals_received"].get("lease_released") == listened, signals
    assert isinstance(signals["receiver_cost"], float)

    burst = records["burst"]
    # Quick sizes: 2 pairs, alternated, each right after its enqueue first.
    assert [r["vacuumed"] for r in burst["runs"]] == [False, True, False, True]
    for run in burst["runs"]:
        _drained(run)
    cold = [r["jobs_per_s"] for r in burst["runs"] if not r["vacuumed"]]
    warm = [r["jobs_per_s"] for r in burst["runs"] if r["vacuumed"]]
    assert burst["unvacuumed_jobs_per_s_runs"] == cold
    assert burst["vacuumed_jobs_per_s_runs"] == warm
    # The ratio is of the two medians, not of one pair.
    expected = statistics.median(cold) / statistics.median(warm)
    assert burst["ratio_unvacuumed_to_vacuumed"] == round(expected, 3)

    fair = records["fairstart"]
    assert len(fair["processes"]) == fair["workers"]
    assert sum(p["completed"] for p in fair["processes"]) == fair["items"]
    assert all(_positive(p["spawn_to_registered_s"]) for p in fair["processes"])
    assert isinstance(fair["met"], bool)

    longrun = records["longrun"]
    assert longrun["claimed_more_than_once"] == 0
    assert longrun["wall_s"] >= longrun["ideal_s"], longrun
    assert all(c >= 1 for c in longrun["connections"]), longrun
    assert all(_positive(x) for x in longrun["rss_mib"]), longrun
    # One-second heartbeats over two-second items: renewals happen.
    assert longrun["renewals"] > 0 and longrun["renewal_hot_share"] is not None, longrun

    steady = records["steady"]
    assert _positive(steady["capacity_jobs_per_s"])
    assert _positive(steady["drain_capacity_jobs_per_s"])
    for run in steady["runs"]:
        calls = run["producer"]["enqueue_ms"]
        assert calls["n"] > 0 and 0 < calls["p50"] <= calls["p99"] <= calls["max"], run
        # The server here runs without autovacuum: the bench vacuums while it produces.
        assert run["vacuums"]["by"] in ("bench", "autovacuum"), run
        assert run["completed"] == run["producer"]["enqueued"] > 0, run
        assert _positive(run["enqueue_to_start_ms"]["p99"]), run
        assert run["enqueue_to_completion_ms"]["p50"] >= run["enqueue_to_start_ms"]["p50"], run
        assert run["backlog"]["per_second"], run
        # Every item falls in one window of enqueue time, the first from 0 s.
        windows = run["enqueue_to_start_ms_by_window"]
        assert windows and windows[0]["from_s"] == 0, run
        assert all(_positive(w["p99"]) and w["p99"] >= w["p50"] for w in windows), run
        # The cost per job beside a drain's: the workers' CPU and transactions.
        _costed(run)
        assert _positive(run["cpu_to_drain"]), run
    assert [r["load"] for r in steady["runs"]] == [0.1, 0.5]
    assert steady["low_load"] == 0.1
    _costed(steady["drain_cost"])
    # The drain reference is the median of every drain at the steady workers' count.
    drain_cpus = [
        r["client_cpu_us_per_job"] for r in throughput["runs"] if r["workers"] == steady["workers"]
    ]
    if drains["workers"] == steady["workers"]:
        drain_cpus = drains["default_cpu_us_per_job"]
    if drain_cpus:
        assert steady["drain_cost"]["client_cpu_drains"] == len(drain_cpus), steady
        expected_cpu = round(statistics.median(drain_cpus), 1)
        assert steady["drain_cost"]["client_cpu_us_per_job"] == expected_cpu, steady
    assert isinstance(steady["low_load_xact_met"], bool), steady
    assert isinstance(steady["low_load_cpu_met"], bool), steady

    longtx = records["longtx"]
    assert [r["long_transaction"] for r in longtx["runs"]] == [False, True]
    assert all(_positive(r["claim_ms"]["p99"]) for r in longtx["runs"])
    assert _positive(longtx["throughput_ratio"])

    # One and four claimers, each flat out and paced by a 5 ms "handler".
    shapes = {(r["claimers"], r["think_ms"] > 0) for r in records["claim"]["runs"]}
    assert {(1, False), (1, True), (4, False), (4, True)} <= shapes, shapes
    for run in records["claim"]["runs"]:
        assert run["claim_ms"]["n"] > 0 and _positive(run["claim_ms"]["p99"]), run
        # Four claimers' p99 against one claimer's with the same pause, same run.
        if run["claimers"] == 4 and run["batch"] == 1:
            assert _positive(run["p99_ratio_to_one_claimer"]), run
            assert isinstance(run["met"], bool), run
        assert _positive(run["server_explain_ms_fresh_backlog"]["execution_ms"]), run
    # The host's control: the minimal table's claim timed by one and four claimers.
    control = records["claim"]["host_control"]
    for count_of in (1, 4):
        assert control[f"claim_ms_{count_of}"]["n"] > 0, control
    assert _positive(control["p99_ratio_4_to_1"]), control
    saturated = next(
        r
        for r in records["claim"]["runs"]
        if r["claimers"] == 4 and r["batch"] == 1 and not r["think_ms"]
    )
    expected = saturated["p99_ratio_to_one_claimer"] / control["p99_ratio_4_to_1"]
    assert control["engine_ratio_over_control"] == round(expected, 2), control
    # The pause check's cost: both variants measured, claim by claim and by drains.
    check = records["claim"]["pause_check"]
    for variant in ("shipped", "without"):
        assert check["claim_ms"][variant]["n"] > 0, check
        assert all(_positive(rate) for rate in check["runworker_jobs_per_s"][variant]), check
        assert _positive(check["server_median_ms"][variant]["planning_ms"]), check

    for run in records["pickup"]["runs"]:
        assert run["items"] > 0 and _positive(run["pickup_ms"]["p50"]), run

    recovery = records["recovery"]
    assert recovery["kill_to_reclaim_s"]["n"] == recovery["items"] * recovery["rounds"]
    assert _positive(recovery["kill_to_reclaim_s"]["min"])

    # Two passes over a table that already holds checkpoints, beside the others:
    # the cleanup from the earlier passes' mark, then with no mark (every task).
    variants = [run["variant"] for run in records["sweep"]["runs"]]
    assert variants[-2:] == [HISTORY, WHOLE_TABLE] and variants.count(HISTORY) == 1
    for run in records["sweep"]["runs"]:
        assert "timed_out_after_s" not in run, run
        assert run["expired"] > 0 and _positive(run["wall_ms"]), run
        with_checkpoints = run["variant"] in (AS_MIGRATED, HISTORY, WHOLE_TABLE)
        assert run["checkpoints_created"] == (run["expired"] if with_checkpoints else 0), run
        if run["variant"] in (HISTORY, WHOLE_TABLE):  # one pass: each loads the checkpoints
            assert run["whole_table_cleanup"] is (run["variant"] == WHOLE_TABLE), run
            assert "wall_ms_runs" not in run and _positive(run["next_pass_nothing_expired_ms"])
        elif run["expired"] <= 1_000:  # several fresh-process passes; their median is reported
            passes = run["wall_ms_runs"]
            assert len(passes) == 2 and run["wall_ms"] == sorted(passes)[1], run
            if run["variant"] == AS_MIGRATED:  # each pass followed by its floor
                floors = run["floor_ms_runs"]
                assert len(floors) == 2 and run["floor_ms"] == sorted(floors)[1], run
                assert run["ratio_to_floor"] == round(run["wall_ms"] / run["floor_ms"], 2)
        else:
            assert "wall_ms_runs" not in run, run

    for variant in ("as_migrated", "worker_renewer"):
        heartbeat = records["heartbeat"][variant]
        assert heartbeat["lost"] == 0 and _positive(heartbeat["renewals_per_s"]), heartbeat
        assert heartbeat["hot_share"] is not None
    # The worker's renewer keeps the indexed expiry while half the lease is
    # left, so PostgreSQL can apply most of its renewals as HOT updates.
    assert records["heartbeat"]["worker_renewer"]["hot_share"] > 0.5

    history = records["history"]
    small, large = history["runs"]
    assert large["rows"] > small["rows"] > 0
    assert large["table_mib"] > small["table_mib"]
    for run in history["runs"]:
        assert _positive(run["claim_ms"]["p99"]) and _positive(run["sweep_ms"]), run
        assert run["sweep_ms"] == sorted(run["sweep_ms_runs"])[1], run

    # A guard against a runaway smoke run, not a speed figure: on a busy shared
    # host the quick run of the other scenarios took 6-8 minutes, and the peers,
    # process mode, tracing, fairness and rate limit scenarios add about 2.
    assert elapsed < 900, f"the quick benchmark took {elapsed:.0f}s"


def test_quick_peers_drain_beside_runworker(quick_run) -> None:
    peers = quick_run[0]["peers"]
    assert set(peers["peers"]) == {
        "procrastinate",
        "django-tasks-db",
        "django-q2",
        "oban (limit 10)",
        "oban (limit 1)",
    }
    for run in peers["runworker"]:
        assert run["finished"] > 0 and _positive(run["jobs_per_s"]), run
    for name, runs in peers["peers"].items():
        for run in runs:
            assert run["waiting_at_start"] >= peers["items"], (name, run)
            assert run["finished"] > 0 and _positive(run["jobs_per_s"]), (name, run)
            assert _positive(run["ratio_ours_to_peer"]), (name, run)


def test_quick_process_mode_beside_threads(quick_run) -> None:
    """Both modes drain every item of both kinds, and each reports its rate and cost."""
    runs = quick_run[0]["process_mode"]["runs"]
    assert {(r["work"], r["execution"]) for r in runs} == {
        (work, execution) for work in ("noop", "50ms") for execution in ("thread", "process")
    }
    for run in runs:
        assert run["completed"] == run["items"] > 0, run
        assert _positive(run["jobs_per_s"]) and _positive(run["client_cpu_us_per_job"]), run


def test_quick_tracing_drains_with_tracing_off_and_on(quick_run) -> None:
    tracing = quick_run[0]["tracing"]
    assert tracing["workers"] == 1
    for run in tracing["off"] + tracing["on"]:
        _drained(run)
    assert len(tracing["off"]) == len(tracing["on"]) == tracing["repeats"]
    # The traced drain's items carried their enqueuer's trace context.
    assert tracing["traced_items"] == tracing["items"]
    assert _positive(tracing["jobs_per_s_on"]) and isinstance(tracing["worker_cost"], float)
    assert _positive(tracing["enqueue_us_off"]) and _positive(tracing["enqueue_us_on"])


def test_quick_fairness_and_rate_limit_scenarios_report_their_figures(quick_run) -> None:
    records = quick_run[0]
    fairness = records["fairness"]
    for label in ("fair", "plain"):
        run = fairness["runs"][label]
        # Tenant B enqueued (without fairness its items may still wait behind A's backlog
        # when the run ends); A's backlog was drained from.
        assert 0 <= run["b_started"] <= run["b_enqueued"] and run["b_enqueued"] > 0, run
        assert run["a_started"] > 0 and _positive(run["jobs_per_s"]), run
        latency = run["b_enqueue_to_start_ms"]
        assert 0 <= latency["p50"] <= latency["p99"], run
    assert _positive(fairness["throughput_ratio_fair_to_plain"])
    assert isinstance(fairness["p99_met"], bool) and isinstance(fairness["throughput_met"], bool)
    rate = records["ratelimit"]
    assert rate["admitted"] > 0 and _positive(rate["admitted_per_s"]), rate
    # The burst is a bound, whatever the host's speed.
    assert 0 < rate["busiest_second"] <= rate["burst"], rate


def test_table_cost_drains_every_table_and_reports_its_ratio() -> None:
    """`bench.table_cost` (not part of `make bench`) on a small run in a database of its own."""
    from bench.common import admin_connect, with_database

    name = f"{urlsplit(database_url()).path.lstrip('/') or 'leasing'}_table_cost"
    url = with_database(database_url(), name)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    with admin_connect(database_url()) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v0"],
            cwd=ROOT,
            env={**env, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "bench.settings"},
            check=True,
            timeout=300,
        )
        proc = subprocess.run(
            [sys.executable, "-m", "bench.table_cost", url, "--items", "600", "--workers", "2",
             "--rounds", "1"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        with admin_connect(database_url()) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(record["tables"]) == {"minimal", "narrow", "bare", "lean", "engine"}
    assert record["tables"]["minimal"]["ratio_to_minimal"] == 1.0
    for table in record["tables"].values():
        assert len(table["jobs_per_s"]) == 1 and _positive(table["median"]), table
        assert _positive(table["ratio_to_minimal"]), table
