"""Sizes, targets and runworker option sets of the benchmark suite (`python -m bench.run`)."""

from __future__ import annotations

from dataclasses import dataclass, field

# How the throughput scenario runs runworker: each process serves only the
# bench work type with one handler thread (a no-op handler gains nothing from
# more threads) and the default, adaptive prefetch (about 0.1 s of work claimed
# ahead while handlers are fast). The `options` scenario compares the rest.
RUNWORKER_OPTIONS: tuple[str, ...] = (
    "--work-type",
    "bench.noop",
    "--concurrency",
    "1",
)

# The runworker option sets the `options` scenario compares (4 processes).
OPTION_GRID: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (label, ("--work-type", "bench.noop", *options) if typed else options)
    for label, typed, options in (
        ("c1 prefetch=adaptive", True, ("--concurrency", "1")),
        ("c1 prefetch=0", True, ("--concurrency", "1", "--prefetch", "0")),
        ("c1 prefetch=32", True, ("--concurrency", "1", "--prefetch", "32")),
        ("c1 prefetch=128", True, ("--concurrency", "1", "--prefetch", "128")),
        ("c4 prefetch=adaptive", True, ("--concurrency", "4")),
        ("c4 prefetch=32", True, ("--concurrency", "4", "--prefetch", "32")),
        ("all work types, c1 prefetch=adaptive", False, ("--concurrency", "1")),
    )
)

TARGETS = {
    "ratio_n4": 1.0,
    "ratio_n1": 0.8,
    "claim_p99_ms": 5.0,
    "pickup_p50_ms": 20.0,
    "enqueue_100k_s": 5.0,
    "sweep_1k_ms": 50.0,
    "sweep_100k_s": 10.0,
    "recovery_slack_s": 1.0,
}


@dataclass
class Sizes:
    items: int = 20_000
    workers: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    enqueue_items: int = 100_000
    options_items: int = 10_000
    options_workers: int = 4
    options_repeats: int = 2
    claim_count: int = 1_000  # claims per claimer process
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
    heartbeat_leases: int = 1_000
    heartbeat_seconds: float = 3.0

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            items=500,
            workers=[1, 2],
            enqueue_items=5_000,
            options_items=300,
            options_workers=2,
            options_repeats=1,
            claim_count=100,
            claim_batch_count=5,
            pickup_items=20,
            pickup_workers=[1],
            recovery_items=5,
            recovery_rounds=1,
            sweep_rows=20_000,
            sweep_expired=[100, 2_000],
            heartbeat_leases=200,
            heartbeat_seconds=0.5,
        )
