"""A process that enqueues dependents of items other processes are finishing.

    python -m tests.procs.enqueue_dependents NAME COUNT SEED GATE [wait]

Picks 1-3 random items among those whose task id starts with `parent-` (and,
every fifth time, one of its own earlier dependents, so chains form) and
enqueues a dependent of them (`test.after_dependencies`, which reports any
dependency not completed when it runs), until COUNT are enqueued. It starts once GATE
parents have ended (completed or failed): a gate on the workers' progress, not
on the wall clock, so the race happens however slowly the processes start. With `wait`, every
other dependent chooses on_dependency_failure="wait". Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from leasing import enqueue
    from leasing.models import WorkItem

    name, count, seed, gate = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    waiting = len(sys.argv) > 5 and sys.argv[5] == "wait"
    rng = random.Random(seed)
    parents = list(
        WorkItem.objects.filter(task_id__startswith="parent-").values_list("pk", flat=True)
    )
    ended = WorkItem.objects.filter(
        task_id__startswith="parent-", status__in=["completed", "failed"]
    )
    give_up = time.monotonic() + 180
    while ended.count() < gate and time.monotonic() < give_up:
        time.sleep(0.01)
    mine: list[str] = []
    for i in range(count):
        deps = rng.sample(parents, rng.randint(1, 3))
        if mine and i % 5 == 0:
            deps.append(rng.choice(mine))
        policy = "wait" if waiting and i % 2 else "fail"
        item = enqueue(
            f"{name}-{i}",
            "test.after_dependencies",
            depends_on=deps,
            on_dependency_failure=policy,
        )
        mine.append(item.work_item_id)
    print(json.dumps({"enqueued": len(mine)}))


if __name__ == "__main__":
    main()
