"""A minimal claimer process for the concurrency tests.

Claims items one batch at a time with its own LeaseManager and connection,
completes each with a fenced release, and prints every claimed id, until
nothing is claimable. Usage: python -m tests.procs.claim_loop WORKER_ID BATCH [TYPE,...]
(with types: a claim filtered to them, read one branch per type every time)
"""

from __future__ import annotations

import os
import sys

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from leasing import LeaseManager

    worker_id, batch = sys.argv[1], int(sys.argv[2])
    types = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    manager = LeaseManager(worker_id)
    if types:
        manager.shape.claimed = lambda *_: None  # keeps the first claim's shape: by type
    idle_rounds = 0
    while idle_rounds < 3:
        leases = manager.acquire_leases(batch, lease_duration_seconds=60, work_type_filter=types)
        if not leases:
            idle_rounds += 1
            continue
        idle_rounds = 0
        for lease in leases:
            manager.release_lease(lease.work_item_id, success=True, output_data={"by": worker_id})
            print(lease.work_item_id, lease.token, flush=True)


if __name__ == "__main__":
    main()
