"""Claim-latency probe: one of several concurrent processes timing `acquire_leases`.

    DJANGO_SETTINGS_MODULE=bench.settings DATABASE_URL=... \\
        python -m bench.claimer HOLDER OUT.json [--batch 1] [--count 1000] [--start-at EPOCH]

Each iteration times one `LeaseManager.acquire_leases(batch, 300,
work_type_filter=["bench.noop"])` call (the call `runworker --work-type
bench.noop` makes) with `time.perf_counter_ns()`: the claim as the worker sees
it, i.e. Python + driver + one round trip + the statement on the server. It
then completes the claimed items in one batch (untimed), as the worker
does, so the table churns the way it does under a real drain; `--think-ms`
pauses after each completion, as a handler that takes that long would;
`--without-pause-check` claims with the pause condition replaced by TRUE (the
claim as it was before pauses existed), the baseline the claim scenario
compares the shipped statement with; `--minimal` times the claim of
`bench.ceiling`'s minimal queue table instead, in plain psycopg (the claim
scenario's control: what the host does to any short claim's latency). The
first claim is not timed (the benchmark holds a lock on work_items until every
claimer is waiting on it, so they start together; `--start-at` is the
alternative). Each process stops when a claim comes back empty or after
`--count` timed claims. The durations go to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("holder")
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--work-type", default="bench.noop")
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument(
        "--think-ms", type=float, default=0.0, help="pause after each completion (a handler)"
    )
    parser.add_argument(
        "--without-pause-check",
        action="store_true",
        help="claim with a statement that has no pause check (the claim scenario's baseline)",
    )
    parser.add_argument(
        "--alternate-pause-check",
        action="store_true",
        help="alternate claim by claim between the shipped statement and the baseline",
    )
    parser.add_argument(
        "--minimal",
        action="store_true",
        help="time the minimal queue table's claim in plain psycopg (the host's control)",
    )
    args = parser.parse_args(argv)
    if args.minimal:
        return _minimal(args)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from django.db import connection

    from bench.pausecheck import set_pause_check

    if args.without_pause_check:
        set_pause_check(False)

    from leasing import LeaseManager
    from leasing.services.completion import complete

    manager = LeaseManager(args.holder)
    connection.ensure_connection()
    delay = args.start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    # The first claim is not timed: it may wait on the benchmark's start gate.
    first = manager.acquire_leases(args.batch, 300, work_type_filter=[args.work_type])
    complete(manager, [(lease, None) for lease in first])
    durations_ns: list[int] = []
    by_variant: dict[str, list[int]] = {"shipped": [], "without": []}
    claimed = len(first)
    for i in range(args.count):
        variant = ("shipped", "without")[i % 2] if args.alternate_pause_check else ""
        if variant:
            set_pause_check(variant == "shipped")
        t0 = time.perf_counter_ns()
        leases = manager.acquire_leases(args.batch, 300, work_type_filter=[args.work_type])
        t1 = time.perf_counter_ns()
        if not leases:
            break
        durations_ns.append(t1 - t0)
        if variant:
            by_variant[variant].append(t1 - t0)
        claimed += len(leases)
        complete(manager, [(lease, None) for lease in leases])
        if args.think_ms:
            time.sleep(args.think_ms / 1000)
    connection.close()
    with open(args.out, "w") as f:
        record = {"holder": args.holder, "claimed": claimed, "durations_ns": durations_ns}
        if args.alternate_pause_check:
            record["durations_ns_by_variant"] = by_variant
        json.dump(record, f)
    return 0


def _minimal(args: argparse.Namespace) -> int:
    """The same timed loop over the minimal table: one statement a claim, as the engine's."""
    from bench.ceiling import MINIMAL_CLAIM, MINIMAL_COMPLETE
    from bench.common import connect

    conn = connect(os.environ["DATABASE_URL"])
    claim = MINIMAL_CLAIM.format(batch=args.batch)
    params = {"holder": args.holder, "lease": 300.0}
    delay = args.start_at - time.time()
    if delay > 0:
        time.sleep(delay)

    def complete(rows: list[tuple[int, int]]) -> None:
        done = {"ids": [r[0] for r in rows], "tokens": [r[1] for r in rows]}
        conn.execute(MINIMAL_COMPLETE, {**done, "holder": args.holder})

    complete(conn.execute(claim, params).fetchall())  # untimed: it may wait on the gate
    durations_ns: list[int] = []
    claimed = 0
    for _ in range(args.count):
        t0 = time.perf_counter_ns()
        rows = conn.execute(claim, params).fetchall()
        t1 = time.perf_counter_ns()
        if not rows:
            break
        durations_ns.append(t1 - t0)
        claimed += len(rows)
        complete(rows)
        if args.think_ms:
            time.sleep(args.think_ms / 1000)
    conn.close()
    with open(args.out, "w") as f:
        json.dump({"holder": args.holder, "claimed": claimed, "durations_ns": durations_ns}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
