"""Sizes, targets and runworker option sets of the benchmark suite (`python -m bench.run`)."""

from __future__ import annotations

from dataclasses import dataclass, field

# How the drain scenarios run runworker: as a user does who sets nothing
# (`runworker --burst`: every work type with a handler, one handler thread,
# adaptive prefetch, the project's default logging). The `options` scenario
# compares other settings; `throughput` also runs it at log level WARNING.
RUNWORKER_OPTIONS: tuple[str, ...] = ()

# The runworker configurations the `options` scenario compares (4 processes): a label, the
# flags, and LEASING["PREFETCH"] (None: adaptive).
OPTION_GRID: tuple[tuple[str, tuple[str, ...], int | None], ...] = tuple(
    (label, ("--work-type", "bench.noop", *flags) if typed else flags, prefetch)
    for label, typed, flags, prefetch in (
        ("c1 prefetch=adaptive", True, ("--concurrency", "1"), None),
        ("c1 prefetch=0", True, ("--concurrency", "1"), 0),
        ("c1 prefetch=32", True, ("--concurrency", "1"), 32),
        ("c1 prefetch=128", True, ("--concurrency", "1"), 128),
        ("c4 prefetch=adaptive", True, ("--concurrency", "4"), None),
        ("c4 prefetch=32", True, ("--concurrency", "4"), 32),
        ("all work types, c1 prefetch=adaptive", False, ("--concurrency", "1"), None),
    )
)

# Option sets drained with fewer items than `options_items`: one claim per
# item runs at ~500 jobs/s on a slow host, so 10,000 items took 25 s.
OPTION_ITEMS_CAP = {"c1 prefetch=0": 2_000}

TARGETS = {
    "ratio_n4": 1.0,
    "ratio_n1": 0.8,
    "ratio_batched_n4": 1.0,  # runworker / the K=100 loop, 4 processes
    "ratio_minimal_n4": 0.7,  # runworker / the K=100 loop over the minimal table, 4 processes
    "logging_cost": 0.10,  # 1 - default-logging rate / WARNING rate, 4 processes
    "burst_unvacuumed_ratio": 0.8,
    "peers_ratio_x4": 10.0,  # runworker / the best peer, 4 processes
    # Same-run ratios where the host decides the absolute figure (issue 43).
    "claim_p99_ratio_4_to_1": 2.0,  # claim p99, 4 claimers / 1 claimer, same pause
    "sweep_1k_to_floor": 1.5,  # the sweep of 1,000 / one UPDATE + INSERT of those rows
    "pickup_p50_ms": 20.0,
    "enqueue_100k_s": 5.0,
    "recovery_slack_s": 1.0,
}


@dataclass
class Sizes:
    items: int = 20_000
    workers: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    warning_workers: list[int] = field(default_factory=lambda: [1, 4])
    logging_repeats: int = 3  # INFO and WARNING drains each at the logging target's count
    ceiling_batches: list[int] = field(default_factory=lambda: [1, 10, 100])
    ceiling_workers: list[int] = field(default_factory=lambda: [1, 2, 4])
    # Per loop process (drain.drain_ceiling): on a slow host the single-item loop
    # makes ~450 jobs/s, so 8 s still times ~3,600 items, and make bench stays
    # under 15 minutes on a slow phase (12 s until 2026-12-01, 15 s before the
    # burst pairs became three).
    ceiling_max_s: float = 8.0
    # Drains of the batched loop where runworker's drains alternate (throughput's
    # logging_repeats): the K=100 ratio is then of two medians.
    ceiling_repeats: int = 3
    burst_items: int = 30_000
    burst_concurrency: int = 4
    burst_repeats: int = 3  # alternated pairs (right after enqueue, after VACUUM ANALYZE)
    fair_items: int = 40_000
    fair_workers: int = 4
    longrun_items: int = 5_000
    longrun_seconds: float = 5.0
    longrun_workers: int = 4
    steady_workers: int = 4
    steady_loads: list[float] = field(default_factory=lambda: [0.1, 0.25, 0.5, 0.9])
    # A load of 10% on a slow phase still enqueues ~13,000 items in 20 s.
    steady_seconds: float = 20.0
    steady_capacity_seconds: float = 16.0
    peers_items: int = 20_000
    peers_workers: list[int] = field(default_factory=lambda: [1, 4])
    peers_window_s: float = 4.0
    history_rows: int = 10_000_000
    longtx_churn: int = 60_000
    # Claims per claimer in longtx (4 claimers: 1,000 samples a half); with the
    # snapshot held a claim takes ~50 ms on a slow host, so 1,000 each took 50 s.
    longtx_claim_count: int = 250
    probe_items: int = 4_000
    probe_workers: int = 4
    wake_probes: int = 1_000  # SELECT 1 round trips each way (machine's wake probe)
    enqueue_items: int = 100_000
    options_items: int = 10_000
    options_workers: int = 4
    options_repeats: int = 1
    claim_count: int = 1_000  # claims per claimer process
    # The claim's pause check: drains each way, alternated. Five: with three, one
    # slow or fast drain moved the median by 5-10% (2026-11-27 07:02: 16,674 /
    # 19,788 / 20,374 jobs/s without the check). And EXPLAINs of each statement.
    pause_check_repeats: int = 5
    pause_check_explains: int = 20
    claim_batch_count: int = 100  # claims of 32 per claimer process
    pickup_items: int = 200
    pickup_workers: list[int] = field(default_factory=lambda: [1, 4])
    pickup_gap_ms: tuple[float, float] = (20.0, 50.0)
    recovery_items: int = 20
    recovery_rounds: int = 3
    recovery_lease_s: float = 2.0
    recovery_heartbeat_s: float = 0.5
    recovery_sweep_interval_s: float = 0.5
    sweep_rows: int = 1_000_000
    sweep_expired: list[int] = field(default_factory=lambda: [1_000, 100_000])
    # Passes over 1,000 expired leases, each in a fresh process, and as many floors
    # alternated with them: with three, one slow pass of a bimodal 65 / 95-125 ms
    # moved the median ratio from 1.4x to 2.5x.
    sweep_repeats: int = 5
    # Checkpoints already in the table for the sweep's retention cleanup: 5 a task,
    # the newest 12,000 within the last minute (200 a second).
    sweep_history_checkpoints: int = 1_000_000
    heartbeat_leases: int = 1_000
    heartbeat_seconds: float = 3.0

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            items=500,
            workers=[1, 2],
            warning_workers=[2],
            logging_repeats=2,
            ceiling_workers=[2],
            ceiling_repeats=2,
            burst_items=1_000,
            burst_repeats=2,
            fair_items=1_000,
            fair_workers=2,
            longrun_items=200,
            longrun_seconds=2.0,
            longrun_workers=2,
            steady_workers=2,
            steady_loads=[0.1, 0.5],
            steady_seconds=3.0,
            steady_capacity_seconds=4.0,
            peers_items=300,
            peers_workers=[1],
            peers_window_s=2.0,
            history_rows=100_000,
            longtx_churn=1_000,
            longtx_claim_count=50,
            probe_items=300,
            probe_workers=2,
            wake_probes=200,
            enqueue_items=5_000,
            options_items=300,
            options_workers=2,
            options_repeats=1,
            claim_count=100,
            pause_check_repeats=2,
            pause_check_explains=5,
            claim_batch_count=5,
            pickup_items=20,
            pickup_workers=[1],
            recovery_items=5,
            recovery_rounds=1,
            sweep_rows=20_000,
            sweep_expired=[100, 2_000],
            sweep_repeats=2,
            sweep_history_checkpoints=10_000,
            heartbeat_leases=200,
            heartbeat_seconds=0.5,
        )
