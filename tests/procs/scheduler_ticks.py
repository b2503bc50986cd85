"""One scheduler process for the schedule race test, driven tick by tick.

    python -m tests.procs.scheduler_ticks START_ISO NAME

Syncs a schedule NAME ticking every second (test.noop), then reads lines from
stdin: a number N moves this process's clock with time-machine to START + N
seconds (plus a little jitter, so the racing processes' clocks differ as
real hosts' do) and runs one scheduler pass at that time; it prints one JSON
line, {"n": N, "fired": [[tick, work_item_id, duplicate], ...]}. `quit` ends.
"""

from __future__ import annotations

import json
import os
import random
import sys
from datetime import UTC, datetime, timedelta

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    import time_machine

    from leasing.services.schedules import run_due, sync_from_settings
    from leasing.ticks import parse_schedule

    start, name = datetime.fromisoformat(sys.argv[1]), sys.argv[2]
    spec = parse_schedule(name, {"work_type": "test.noop", "every": 1})
    sync_from_settings([spec], now=start)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        n = int(line)
        moment = start + timedelta(seconds=n, milliseconds=random.randint(0, 300))
        with time_machine.travel(moment, tick=False):
            fired = run_due(now=datetime.now(UTC))
        rows = [[f.tick.isoformat(), f.work_item_id, f.duplicate] for f in fired]
        print(json.dumps({"n": n, "fired": rows}), flush=True)


if __name__ == "__main__":
    main()
