"""One timed recovery pass in a fresh process: `RecoverySweep(...).scan_and_recover()`.

    DJANGO_SETTINGS_MODULE=bench.settings DATABASE_URL=... python -m bench.sweeper OUT.json \
        [--no-checkpoints]

Run as a subprocess so the benchmark can enforce a time limit on a slow pass.
Times the first pass (the one that recovers) and a second pass right after
(nothing left to recover) with `time.perf_counter()` around the call, and
writes both with the pass's own `RecoveryStats` to OUT.json. The console's
hourly rollup is brought up to date first, untimed: a sweep that has been
running keeps it so, and its pass then only reads the rollup's mark (a new
sweep's first passes on a large table each fold up to 48 hours of history).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = argv[0]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from django.db import connection

    from leasing.services.rollups import roll_up_finished_hours
    from leasing.sweep import RecoverySweep

    connection.ensure_connection()
    roll_up_finished_hours(max_hours=24 * 9)
    sweep = RecoverySweep(
        scan_interval_seconds=60, create_checkpoints="--no-checkpoints" not in argv[1:]
    )
    result = {}
    for name in ("first", "second"):
        start = time.perf_counter()
        stats = sweep.scan_and_recover()
        wall_ms = (time.perf_counter() - start) * 1000
        result[name] = {"wall_ms": round(wall_ms, 1), **stats.as_dict()}
    connection.close()
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
