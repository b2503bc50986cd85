"""A process that enqueues a run of unique keys, once each (the unique-enqueue race test).

    python -m tests.procs.enqueue_unique PREFIX SCOPE COUNT START_AT

Enqueues the keys PREFIX-0 ... PREFIX-(COUNT-1) in that order, one call each.
SCOPE is `pending`, `unfinished` or a number of seconds (a period). Starts at
the wall-clock time START_AT, so that every process races from the first key
and processes running the same keys in the same order keep meeting on one
key; then prints one JSON line: how many calls inserted and how many got a
duplicate, and the id each key's call returned.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from leasing import enqueue

    prefix, scope, count, start_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    unique_while = scope if scope in ("pending", "unfinished") else timedelta(seconds=float(scope))
    time.sleep(max(0.0, start_at - time.time()))
    inserted = duplicates = 0
    ids: dict[str, str] = {}
    for i in range(count):
        key = f"{prefix}-{i}"
        item = enqueue(f"race-{i}", "test.noop", unique_key=key, unique_while=unique_while)
        ids[key] = item.work_item_id
        if item.duplicate:
            duplicates += 1
        else:
            inserted += 1
    print(json.dumps({"inserted": inserted, "duplicates": duplicates, "ids": ids}))


if __name__ == "__main__":
    main()
