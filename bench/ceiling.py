"""The ceiling: a plain psycopg 3 claim/complete loop, no Django (one process of many).

    python -m bench.ceiling DATABASE_URL HOLDER [--batch K] [--work-type bench.noop]
                            [--table engine|minimal]

Per round, two autocommit statements (two commits) for up to K jobs:

1. claim up to K rows: an UPDATE of the rows a `SELECT ... ORDER BY priority
   DESC, created_at, work_item_id LIMIT K FOR UPDATE SKIP LOCKED` picked,
   RETURNING id and token -- the same claim order, filters and SET list as
   `LeaseManager.acquire_leases`;
2. complete them with one UPDATE fenced by holder + token + status per row,
   like `LeaseManager.release_lease(success=True)` for each.

With K = 1 that is the single-item loop (two commits a job); K = 10 and 100 are
the batched loops a batching worker is measured against. `--table minimal` runs
the same loop over `MINIMAL_TABLE` instead of `work_items`: a queue table with
only what a claim and a completion need (id, status, priority, times, lease
columns) and one partial claim index, the bar for the engine's own table and
its indexes (`MINIMAL_DDL`; the bench creates and fills it). It exits when a claim
finds nothing (like `runworker --burst`) and prints one JSON line:
{"holder", "batch", "completed", "lost", "rounds", "seconds"}. psycopg's
defaults apply, including server-side prepared statements after 5 executions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import psycopg

from bench.common import connect

# The best a loop can do: the engine's claim order and index, its planner
# settings (walk the index in order whatever the statistics say), one statement.
CLAIM = """
SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off;
WITH picked AS (
    SELECT work_item_id FROM work_items
    WHERE status = 'pending' AND dependencies_left = 0
      AND COALESCE(run_after, created_at) <= statement_timestamp()
      AND work_type = %(work_type)s
    ORDER BY priority DESC, COALESCE(run_after, created_at), created_at, work_item_id
    LIMIT {batch}
    FOR UPDATE SKIP LOCKED
)
UPDATE work_items AS w SET
    status = 'in_progress', lease_holder = %(holder)s, lease_token = w.lease_token + 1,
    lease_acquired_at = statement_timestamp(),
    lease_expires_at = statement_timestamp() + make_interval(secs => %(lease)s),
    lease_deadline_at = statement_timestamp() + interval '4 hours',
    heartbeat_at = statement_timestamp(), progress_at = NULL,
    started_at = COALESCE(w.started_at, statement_timestamp()),
    updated_at = statement_timestamp()
FROM picked WHERE w.work_item_id = picked.work_item_id
RETURNING w.work_item_id, w.lease_token
"""

# The minimal queue table: what a claim and a completion need and nothing else.
MINIMAL_TABLE = "bench_minimal_queue"


def minimal_queue(table: str, key: str, key_type: str) -> tuple[str, str, str]:
    """(DDL, claim, completion) of a minimal queue table named `table` whose key is
    `key` (`key_type`, "bigint" made by identity or any other type given by the
    filler); the claim is a template of `{batch}`. `bench.table_cost` makes one
    with work_items' text key."""
    made = " GENERATED ALWAYS AS IDENTITY" if key_type == "bigint" else ""
    ddl = f"""
CREATE TABLE IF NOT EXISTS {table} (
    {key} {key_type}{made} PRIMARY KEY,
    status text NOT NULL DEFAULT 'pending',
    priority integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    started_at timestamptz,
    completed_at timestamptz,
    lease_holder text,
    lease_token bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz
);
CREATE INDEX IF NOT EXISTS {table}_claim_idx
    ON {table} (priority DESC, created_at, {key}) WHERE status = 'pending'
"""
    claim = f"""
WITH picked AS (
    SELECT {key} FROM {table} WHERE status = 'pending'
    ORDER BY priority DESC, created_at, {key}
    LIMIT {{batch}}
    FOR UPDATE SKIP LOCKED
)
UPDATE {table} AS q SET
    status = 'in_progress', lease_holder = %(holder)s, lease_token = q.lease_token + 1,
    lease_expires_at = statement_timestamp() + make_interval(secs => %(lease)s),
    started_at = statement_timestamp()
FROM picked WHERE q.{key} = picked.{key}
RETURNING q.{key}, q.lease_token
"""
    complete = f"""
UPDATE {table} AS q SET
    status = 'completed', lease_holder = NULL, lease_expires_at = NULL,
    completed_at = statement_timestamp()
FROM unnest(%(ids)s::{key_type}[], %(tokens)s::bigint[]) AS done({key}, lease_token)
WHERE q.{key} = done.{key} AND q.lease_token = done.lease_token
  AND q.lease_holder = %(holder)s AND q.status = 'in_progress'
"""
    return ddl, claim, complete


MINIMAL_DDL, MINIMAL_CLAIM, MINIMAL_COMPLETE = minimal_queue(MINIMAL_TABLE, "id", "bigint")

COMPLETE = """
UPDATE work_items AS w SET
    status = 'completed', output_data = NULL, error_message = NULL,
    lease_holder = NULL, lease_expires_at = NULL, lease_deadline_at = NULL,
    completed_at = statement_timestamp(), updated_at = statement_timestamp()
FROM unnest(%(ids)s::text[], %(tokens)s::bigint[]) AS done(work_item_id, lease_token)
WHERE w.work_item_id = done.work_item_id AND w.lease_token = done.lease_token
  AND w.lease_holder = %(holder)s AND w.status = 'in_progress'
"""


def loop(
    conn: Any, claim: str, complete: str, params: dict[str, Any], holder: str, deadline: float
) -> tuple[int, int, int]:
    """Claim and complete until a claim finds nothing or `deadline` (perf_counter)
    passes; returns (completed, lost, rounds)."""
    completed = lost = rounds = 0
    # Client-side binding: the claim and its SET LOCALs go in one round trip.
    claimer = psycopg.ClientCursor(conn)
    while time.perf_counter() < deadline:
        claimer.execute(claim, params)
        while claimer.description is None and claimer.nextset():
            pass
        claimed = claimer.fetchall()
        if not claimed:
            break
        rounds += 1
        done = {"ids": [r[0] for r in claimed], "tokens": [r[1] for r in claimed]}
        written = conn.execute(complete, {**done, "holder": holder}).rowcount
        completed += written
        lost += len(claimed) - written
    return completed, lost, rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("database_url")
    parser.add_argument("holder")
    parser.add_argument("--batch", type=int, default=1, help="rows per claim (K, default 1)")
    parser.add_argument("--work-type", default="bench.noop")
    parser.add_argument("--lease-seconds", type=float, default=300.0)
    parser.add_argument("--start-at", type=float, default=0.0, help="time.time() to start at")
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument(
        "--table",
        choices=("engine", "minimal"),
        default="engine",
        help=f"work_items (engine, default) or {MINIMAL_TABLE} (minimal)",
    )
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error(f"--batch must be at least 1, got {args.batch}")

    conn = connect(args.database_url)
    # K is written into the statement, so the planner always knows how small
    # the limit is (a generic plan of a prepared `LIMIT $n` assumes 10% of the rows).
    minimal = args.table == "minimal"
    statement = (MINIMAL_CLAIM if minimal else CLAIM).format(batch=args.batch)
    complete = MINIMAL_COMPLETE if minimal else COMPLETE
    claim = {"holder": args.holder, "lease": args.lease_seconds, "work_type": args.work_type}
    delay = args.start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    started = time.perf_counter()
    with conn:
        completed, lost, rounds = loop(
            conn, statement, complete, claim, args.holder, started + args.max_seconds
        )
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "holder": args.holder,
                "batch": args.batch,
                "table": args.table,
                "completed": completed,
                "lost": lost,
                "rounds": rounds,
                "seconds": round(seconds, 4),
            }
        )
    )
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
