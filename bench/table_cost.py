"""What the queue table costs the K = 100 loop: the same loop over five tables, one run.

    python -m bench.table_cost DATABASE_URL [--items 40000] [--workers 4] [--rounds 3]

DATABASE_URL names a migrated database it may fill and empty (not one in
use: it truncates `work_items`). Each table is filled with `--items` pending
rows, vacuumed and analyzed, then drained by `--workers` processes running
`bench.ceiling`'s K = 100 claim and completion; the tables take turns,
`--rounds` times, and it prints each drain and the medians against the
minimal table's:

    minimal  bench.ceiling's minimal queue table: bigint key, 9 columns, one claim index
    narrow   the minimal table's columns with `work_items`' text key
    bare     `work_items`' columns with its primary key and claim index only, no checks
    lean     `work_items` without the console's indexes (newest first, by task,
             finished, status counts): what the claim, the sweep, limits and unique
             keys need, with every check
    engine   `work_items` as migrated

Not part of `make bench`: it answers one question (which part of the table
the loop pays for) and its figures are in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import time
from typing import Any

from bench.ceiling import (
    CLAIM,
    COMPLETE,
    MINIMAL_CLAIM,
    MINIMAL_COMPLETE,
    MINIMAL_DDL,
    MINIMAL_TABLE,
    loop,
    minimal_queue,
)
from bench.common import connect

BATCH = 100
TABLES = ("minimal", "narrow", "bare", "lean", "engine")
# The console's indexes of work_items, by their leading key.
CONSOLE_KEYS = ("(created_at DESC", "(task_id", "(completed_at", "(retry_count")

NARROW_DDL, _NARROW_CLAIM, NARROW_COMPLETE = minimal_queue(
    "bench_narrow_queue", "work_item_id", "text"
)
NARROW_CLAIM = _NARROW_CLAIM.format(batch=BATCH)
BARE_DDL = """
CREATE TABLE IF NOT EXISTS bench_bare_items (LIKE work_items INCLUDING DEFAULTS);
ALTER TABLE bench_bare_items DROP CONSTRAINT IF EXISTS bench_bare_items_pkey;
ALTER TABLE bench_bare_items ADD PRIMARY KEY (work_item_id);
CREATE INDEX IF NOT EXISTS bench_bare_items_claim_idx ON bench_bare_items
    (work_type, priority DESC, COALESCE(run_after, created_at), created_at, work_item_id,
     run_after, queue_name)
    WHERE dependencies_left = 0 AND status = 'pending'
"""

ENGINE_TABLES = {"bare": "bench_bare_items", "lean": "bench_lean_items", "engine": "work_items"}


def statements(table: str) -> tuple[str, str, str]:
    """(claim, completion, table name) of one table's loop."""
    if table == "minimal":
        return MINIMAL_CLAIM.format(batch=BATCH), MINIMAL_COMPLETE, MINIMAL_TABLE
    if table == "narrow":
        return NARROW_CLAIM, NARROW_COMPLETE, "bench_narrow_queue"
    name = ENGINE_TABLES[table]
    return (
        CLAIM.format(batch=BATCH).replace("work_items", name),
        COMPLETE.replace("work_items", name),
        name,
    )


def create_tables(conn: Any) -> None:
    conn.execute(MINIMAL_DDL)
    conn.execute(NARROW_DDL)
    conn.execute(BARE_DDL)
    conn.execute("CREATE TABLE IF NOT EXISTS bench_lean_items (LIKE work_items INCLUDING ALL)")
    indexes = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'bench_lean_items'"
    ).fetchall()
    for name, definition in indexes:
        if any(key in definition for key in CONSOLE_KEYS):
            conn.execute(f'DROP INDEX "{name}"')


def fill(conn: Any, table: str, items: int) -> None:
    name = statements(table)[2]
    conn.execute(f"TRUNCATE {name} CASCADE")
    created = "statement_timestamp() + g * interval '1 microsecond'"
    key = "'01JB' || lpad(g::text, 22, '0')"  # a ULID's 26 characters
    if table == "minimal":
        conn.execute(
            f"INSERT INTO {name} (created_at) SELECT {created} FROM generate_series(1, %s) AS g",
            [items],
        )
    elif table == "narrow":
        conn.execute(
            f"INSERT INTO {name} (work_item_id, created_at) SELECT {key}, {created} "
            "FROM generate_series(1, %s) AS g",
            [items],
        )
    else:
        conn.execute(
            f"INSERT INTO {name} (work_item_id, task_id, work_type, created_at) "
            f"SELECT {key}, {key}, 'bench.noop', {created} FROM generate_series(1, %s) AS g",
            [items],
        )
    conn.execute(f"VACUUM ANALYZE {name}")
    conn.execute("CHECKPOINT")


def worker(url: str, table: str, holder: str, start_at: float, results: Any) -> None:
    """One process of a drain: the ceiling's loop over `table` from `start_at` (epoch)."""
    claim, complete, _ = statements(table)
    conn = connect(url)
    params = {"holder": holder, "lease": 300.0, "work_type": "bench.noop"}
    time.sleep(max(0.0, start_at - time.time()))
    completed, _, _ = loop(conn, claim, complete, params, holder, math.inf)
    results.put((completed, time.time()))
    conn.close()


def drain(url: str, table: str, items: int, workers: int) -> float:
    """One drain's jobs/s, from the common start to the last loop's end."""
    with connect(url) as conn:
        fill(conn, table, items)
    results: Any = multiprocessing.Queue()
    start_at = time.time() + 1.0
    procs = [
        multiprocessing.Process(target=worker, args=(url, table, f"h{i}", start_at, results))
        for i in range(workers)
    ]
    for proc in procs:
        proc.start()
    ends = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    completed = sum(done for done, _ in ends)
    if completed != items:
        raise SystemExit(f"{table}: completed {completed} of {items}")
    return completed / (max(end for _, end in ends) - start_at)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("database_url")
    parser.add_argument("--items", type=int, default=40_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tables", default=",".join(TABLES))
    args = parser.parse_args(argv)
    tables = args.tables.split(",")
    unknown = set(tables) - set(TABLES)
    if unknown or "minimal" not in tables:
        parser.error(f"--tables: a list of {', '.join(TABLES)}, minimal among them")
    with connect(args.database_url) as conn:
        create_tables(conn)
    rates: dict[str, list[float]] = {table: [] for table in tables}
    for _ in range(args.rounds):
        for table in tables:
            rate = drain(args.database_url, table, args.items, args.workers)
            rates[table].append(round(rate))
            print(f"{table}: {rate:,.0f} jobs/s", file=sys.stderr, flush=True)
    bar = statistics.median(rates["minimal"])
    summary = {
        table: {
            "jobs_per_s": runs,
            "median": statistics.median(runs),
            "ratio_to_minimal": round(statistics.median(runs) / bar, 3),
        }
        for table, runs in rates.items()
    }
    print(json.dumps({"workers": args.workers, "items": args.items, "tables": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
