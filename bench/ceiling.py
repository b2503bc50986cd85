"""The ceiling: a plain psycopg 3 claim/complete loop, no Django (one process of many).

    python -m bench.ceiling DATABASE_URL HOLDER [--work-type bench.noop] [--start-at EPOCH]

Per job, two autocommit statements (two commits):

1. claim one row: one UPDATE ... WHERE work_item_id = (SELECT ... ORDER BY
   priority DESC, created_at, work_item_id LIMIT 1 FOR UPDATE SKIP LOCKED)
   RETURNING id, token -- the same claim order, filters and SET list as
   `LeaseManager.acquire_leases`;
2. complete it with an UPDATE fenced by holder + token + status, like
   `LeaseManager.release_lease(success=True)`.

It exits when a claim finds nothing (like `runworker --burst`) and prints one
JSON line: {"holder", "completed", "seconds"}. psycopg's defaults apply,
including server-side prepared statements after 5 executions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench.common import connect

CLAIM = """
UPDATE work_items SET
    status = 'in_progress', lease_holder = %(holder)s, lease_token = lease_token + 1,
    lease_acquired_at = statement_timestamp(),
    lease_expires_at = statement_timestamp() + make_interval(secs => %(lease)s),
    lease_deadline_at = statement_timestamp() + interval '4 hours',
    heartbeat_at = statement_timestamp(), progress_at = NULL,
    started_at = COALESCE(started_at, statement_timestamp()),
    updated_at = statement_timestamp()
WHERE work_item_id = (
    SELECT work_item_id FROM work_items
    WHERE status = 'pending'
      AND (run_after IS NULL OR run_after <= statement_timestamp())
      AND work_type = %(work_type)s
    ORDER BY priority DESC, created_at, work_item_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING work_item_id, lease_token
"""

COMPLETE = """
UPDATE work_items SET
    status = 'completed', output_data = NULL, error_message = NULL,
    lease_holder = NULL, lease_expires_at = NULL,
    completed_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE work_item_id = %s AND lease_holder = %s AND lease_token = %s AND status = 'in_progress'
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("database_url")
    parser.add_argument("holder")
    parser.add_argument("--work-type", default="bench.noop")
    parser.add_argument("--lease-seconds", type=float, default=300.0)
    parser.add_argument("--start-at", type=float, default=0.0, help="time.time() to start at")
    parser.add_argument("--max-seconds", type=float, default=600.0)
    args = parser.parse_args(argv)

    conn = connect(args.database_url)
    params = {"holder": args.holder, "lease": args.lease_seconds, "work_type": args.work_type}
    delay = args.start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    completed = lost = 0
    started = time.perf_counter()
    deadline = started + args.max_seconds
    with conn:
        while time.perf_counter() < deadline:
            row = conn.execute(CLAIM, params).fetchone()
            if row is None:
                break
            cur = conn.execute(COMPLETE, (row[0], args.holder, row[1]))
            if cur.rowcount == 1:
                completed += 1
            else:
                lost += 1
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "holder": args.holder,
                "completed": completed,
                "lost": lost,
                "seconds": round(seconds, 4),
            }
        )
    )
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
