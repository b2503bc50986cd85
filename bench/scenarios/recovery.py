"""recovery: a SIGKILLed worker's items, from the kill to their re-claim by another worker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from bench.common import PYTHON, BenchError, progress, wait_for
from bench.config import TARGETS
from bench.context import Bench
from bench.measure import sec_summary
from bench.report import Row


def run(bench: Bench) -> dict[str, Any]:
    s = bench.sizes
    bench.reset()
    sweeper, _ = bench.procs.spawn(
        [PYTHON, "manage.py", "recoverysweep", "--json"],
        env=bench.leasing_env(SWEEP_INTERVAL=s.recovery_sweep_interval_s),
        name="recovery-sweeper",
    )
    rounds = []
    try:
        wait_for(
            lambda: bench.one(
                "SELECT count(*) FROM workers WHERE role = 'sweeper' AND status = 'running'"
            ),
            60,
            "the recovery sweep to start",
        )
        for index in range(s.recovery_rounds):
            progress(f"  round {index + 1}/{s.recovery_rounds}")
            rounds.append(recovery_round(bench, index))
    finally:
        bench.procs.stop(sweeper, grace_s=15)
    bench.check_exit([sweeper], "recoverysweep")
    total = [x for r in rounds for x in r["kill_to_reclaim_s_each"]]
    bound = s.recovery_lease_s + s.recovery_sweep_interval_s + TARGETS["recovery_slack_s"]
    return {
        "measures": "k bench.sleep items held by a runworker (lease L, renewals every H) "
        "that is SIGKILLed; `recoverysweep` (SWEEP_INTERVAL S) re-queues them, an idle runworker "
        "re-claims them: new lease_acquired_at - statement_timestamp() right after the "
        "kill, split at the expired lease_expires_at and the sweep's error_boundary "
        "checkpoint (all database clock)",
        "items": s.recovery_items,
        "rounds": s.recovery_rounds,
        "lease_s": s.recovery_lease_s,
        "heartbeat_s": s.recovery_heartbeat_s,
        "sweep_interval_s": s.recovery_sweep_interval_s,
        "kill_to_reclaim_s": sec_summary(total),
        "per_round": [{k: v for k, v in r.items() if not k.endswith("_each")} for r in rounds],
        "bound_s": bound,
        "met": max(total) <= bound,
    }


def _held_by(bench: Bench, holder: str) -> int:
    return bench.one("SELECT count(*) FROM work_items WHERE lease_holder = %s", [holder])


def recovery_round(bench: Bench, index: int) -> dict[str, Any]:
    from leasing import enqueue_many

    s = bench.sizes
    k = s.recovery_items
    victim_id, rescuer_id = f"bench-victim-{index}", f"bench-rescuer-{index}"
    bench.sql("TRUNCATE work_items, checkpoints CASCADE")
    enqueue_many(
        [
            {"task_id": f"rec-{i}", "work_type": "bench.sleep", "input_data": {"seconds": 120}}
            for i in range(k)
        ]
    )
    victim = bench.runworker(
        "--work-type", "bench.sleep", "--concurrency", str(k), "--worker-id", victim_id,
        name=f"recovery-victim-{index}",
        leasing={
            "PREFETCH": 0,
            "LEASE_DURATION": s.recovery_lease_s,
            "HEARTBEAT_INTERVAL": s.recovery_heartbeat_s,
        },
    )  # fmt: skip
    rescuer = None
    try:
        wait_for(
            lambda: (
                bench.one(
                    "SELECT count(*) FROM work_items WHERE lease_holder = %s "
                    "AND status = 'in_progress'",
                    [victim_id],
                )
                == k
            ),
            60,
            f"the victim worker to hold all {k} items",
        )
        rescuer = bench.runworker(
            "--work-type", "bench.sleep", "--concurrency", str(k), "--worker-id", rescuer_id,
            name=f"recovery-rescuer-{index}",
            leasing={"PREFETCH": 0, "SHUTDOWN_TIMEOUT": 1},
        )  # fmt: skip
        wait_for(
            lambda: (
                bench.one(
                    "SELECT count(*) FROM workers WHERE worker_id = %s AND status = 'running'",
                    [rescuer_id],
                )
                and bench.listening() >= 2
            ),
            60,
            "the rescuing worker",
        )
        time.sleep(2 * s.recovery_heartbeat_s)  # a renewal or two in steady state
        victim.kill()  # SIGKILL
        kill_at = bench.one("SELECT statement_timestamp()")
        victim.wait(timeout=10)
        wait_for(
            lambda: _held_by(bench, rescuer_id) == k,
            60,
            "the rescuing worker to re-claim every item",
            interval_s=0.05,
        )
        got = bench.sql(
            """
            SELECT extract(epoch FROM w.lease_acquired_at - %s),
                   extract(epoch FROM (c.snapshot_data->>'lease_expires_at')::timestamptz - %s),
                   extract(epoch FROM c.created_at
                                      - (c.snapshot_data->>'lease_expires_at')::timestamptz),
                   extract(epoch FROM w.lease_acquired_at - c.created_at)
            FROM work_items w
            JOIN checkpoints c ON c.work_item_id = w.work_item_id
                              AND c.checkpoint_type = 'error_boundary'
            """,
            [kill_at, kill_at],
        )
    finally:
        if rescuer is not None:
            bench.procs.stop(rescuer, grace_s=15)
        bench.procs.stop(victim, grace_s=1)
    if len(got) != k:
        raise BenchError(f"{len(got)} of {k} items have a recovery checkpoint")
    total = [float(r[0]) for r in got]
    return {
        "kill_to_reclaim_s": sec_summary(total),
        "kill_to_lease_expiry_s": sec_summary([float(r[1]) for r in got]),
        "expiry_to_sweep_s": sec_summary([float(r[2]) for r in got]),
        "sweep_to_reclaim_s": sec_summary([float(r[3]) for r in got]),
        "kill_to_reclaim_s_each": total,
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    t = r["kill_to_reclaim_s"]
    yield Row(
        f"recovery s (lease {r['lease_s']:g}, sweep {r['sweep_interval_s']:g}), "
        f"{r['rounds']} kill(s), p50/max",
        f"{t['p50']} / {t['max']}",
        f"<= {r['bound_s']:g}",
        r["met"],
        absolute=True,
    )
    for i, rr in enumerate(r["per_round"]):
        yield Row(
            f"  kill {i + 1}: to expiry / sweep lag / pickup lag (max s)",
            f"{rr['kill_to_lease_expiry_s']['max']} / {rr['expiry_to_sweep_s']['max']} / "
            f"{rr['sweep_to_reclaim_s']['max']}",
        )
