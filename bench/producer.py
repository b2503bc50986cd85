"""A producer at a fixed rate: `enqueue_many()` every tick for a fixed time (steady state).

    DJANGO_SETTINGS_MODULE=bench.settings DATABASE_URL=... \\
        python -m bench.producer OUT.json --rate 2000 --seconds 60 [--tick 0.01]

Every `--tick` seconds it enqueues the items due by then (rate x elapsed,
minus what it already enqueued), so a slow tick is made up at the next one and
the rate holds on average. It writes {"enqueued", "seconds", "rate",
"late_ticks", "enqueue_ms"} to OUT.json; a tick is late when it started over
one tick behind, and `enqueue_ms` is the p50/p99/max wall time of the
`enqueue_many()` calls: an item's `created_at` is its INSERT's statement time,
and no worker can see it before the call's commit, which waits for the WAL to
reach the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rate", type=float, required=True, help="items per second")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--tick", type=float, default=0.01)
    parser.add_argument("--work-type", default="bench.noop")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.seconds <= 0 or args.tick <= 0:
        parser.error("--rate, --seconds and --tick must be positive")

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from django.db import connection

    from bench.common import summary_ms
    from leasing import enqueue_many

    connection.ensure_connection()
    enqueued = late = 0
    calls_ms: list[float] = []
    start = time.perf_counter()
    next_tick = start
    while True:
        now = time.perf_counter()
        elapsed = now - start
        if elapsed >= args.seconds:
            break
        if now - next_tick > args.tick:
            late += 1
        due = int(args.rate * elapsed) - enqueued
        if due > 0:
            called = time.perf_counter()
            enqueue_many(
                [
                    {"task_id": f"steady-{enqueued + i}", "work_type": args.work_type}
                    for i in range(due)
                ]
            )
            calls_ms.append((time.perf_counter() - called) * 1000)
            enqueued += due
        next_tick += args.tick
        pause = next_tick - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    seconds = time.perf_counter() - start
    connection.close()
    with open(args.out, "w") as f:
        json.dump(
            {
                "enqueued": enqueued,
                "seconds": round(seconds, 3),
                "rate": round(enqueued / seconds, 1),
                "late_ticks": late,
                "enqueue_ms": summary_ms(calls_ms),
            },
            f,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
