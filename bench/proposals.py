"""What-if measurements behind the library changes proposed in BENCHMARKS.md (not `make bench`).

    .venv/bin/python -m bench.proposals sweep      # RecoverySweep: batched task locks, join fix
    .venv/bin/python -m bench.proposals enqueue    # enqueue_many: where 100,000 items spend time
    .venv/bin/python -m bench.proposals claim      # one claim: Python, binding, commit, server
    .venv/bin/python -m bench.proposals all

Each experiment runs the library as it is, then the same operation with one
proposed change applied by monkeypatching (in this process only, on the
throwaway database `leasing_bench_proposals`), and prints one JSON line per
variant plus a table. The patches are prototypes of the proposals, written
against the library as of this benchmark; if the library has moved on they
may no longer apply, which the script reports instead of measuring.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from bench.common import DEFAULT_SERVER_URL, emit, install_cleanup, progress, summary_ms

# --- helpers ----------------------------------------------------------------------------


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def statement_times() -> Iterator[dict[str, list[float]]]:
    """Milliseconds per statement kind (its first words) run on Django's connection."""
    from django.db import connection

    times: dict[str, list[float]] = defaultdict(list)

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            key = " ".join(sql.split())[:48]
            times[key].append((time.perf_counter() - start) * 1000)

    with connection.execute_wrapper(wrapper):
        yield times


def breakdown(times: dict[str, list[float]]) -> list[dict[str, Any]]:
    rows = [
        {"statement": key, "count": len(v), "total_ms": round(sum(v), 1)}
        for key, v in times.items()
    ]
    return sorted(rows, key=lambda r: -r["total_ms"])[:6]


# --- sweep -----------------------------------------------------------------------------------


def batched_lock_task_sequences(using: str, task_ids: Any) -> list[str]:
    """Proposal: every task lock of a batch in ONE statement, still in sorted order.

    unnest() of a sorted array yields its elements in order and the SELECT list
    is evaluated row by row, so the locks are taken in the same global order
    as one statement per task was.
    """
    from leasing.db import Dialect, execute

    ordered = sorted(set(task_ids))
    if ordered and Dialect(using).is_postgres:
        execute(
            using,
            "SELECT count(pg_advisory_xact_lock(hashtextextended('leasing.checkpoints:' || t, 0)))"
            " FROM unnest(%s::text[]) AS t",
            [ordered],
        )
    return ordered


def update_batch_postgres_v2(self: Any, d: Any, fail_types: list[str]) -> list[dict[str, Any]]:
    """Proposal: join the locked candidates to work_items by primary key only.

    The candidate CTE already locked rows that are in_progress and expired (FOR
    UPDATE re-checks the newest row version), so the UPDATE needs only the
    id + token match; re-testing `status` and `lease_expires_at` on `w` let
    the planner drive the join from the lease-expiry index (every expired
    row) against a re-scanned CTE: O(expired x batch). RETURNING reads the old
    lease from `c`, so no outer join is needed either.
    """
    from leasing.db import execute

    set_sql, set_params = self._set_clause(d)
    sql = f"""
        WITH c AS (
            SELECT work_item_id, lease_holder, lease_token, lease_expires_at, heartbeat_at,
                   (retry_count < max_retries
                    AND NOT work_type = ANY(%s::text[])) AS will_retry,
                   (work_type = ANY(%s::text[])) AS fail_policy
            FROM work_items
            WHERE status = 'in_progress' AND lease_expires_at < {d.now}
            ORDER BY lease_expires_at
            LIMIT %s
            FOR UPDATE SKIP LOCKED
        )
        UPDATE work_items AS w SET {set_sql}
        FROM c
        WHERE w.work_item_id = c.work_item_id AND w.lease_token = c.lease_token
        RETURNING c.work_item_id, c.lease_holder AS old_holder, c.lease_token AS old_token,
                  c.lease_expires_at AS old_expires_at, c.heartbeat_at AS old_heartbeat_at,
                  w.task_id, w.work_type, w.status AS new_status, w.retry_count,
                  w.max_retries, w.error_message, w.updated_at
    """
    return execute(self.using, sql, [fail_types, fail_types, self.batch_size, *set_params])


def experiment_sweep(bench: Any, rows: int, expired_counts: list[int]) -> list[dict[str, Any]]:
    import leasing.recovery as recovery
    from leasing.recovery import RecoverySweep

    variants: list[tuple[str, int, list[tuple[Any, str, Any]]]] = [
        ("as is (batch 500)", 500, []),
        (
            "batched task locks",
            500,
            [(recovery, "lock_task_sequences", batched_lock_task_sequences)],
        ),
        (
            "batched locks + pk join",
            500,
            [
                (recovery, "lock_task_sequences", batched_lock_task_sequences),
                (RecoverySweep, "_update_batch_postgres", update_batch_postgres_v2),
            ],
        ),
        (
            "batched locks + pk join, batch 2000",
            2000,
            [
                (recovery, "lock_task_sequences", batched_lock_task_sequences),
                (RecoverySweep, "_update_batch_postgres", update_batch_postgres_v2),
            ],
        ),
        (
            "batched locks + pk join, batch 2000, no checkpoints",
            2000,
            [
                (recovery, "lock_task_sequences", batched_lock_task_sequences),
                (RecoverySweep, "_update_batch_postgres", update_batch_postgres_v2),
            ],
        ),
    ]
    for target, name, _ in (p for v in variants for p in v[2]):
        if not hasattr(target, name):
            raise SystemExit(f"cannot patch {target.__name__}.{name}: the library has changed")
    progress(f"sweep: loading {rows} rows")
    bench.load_sweep_rows(rows)
    results = []
    for expired in expired_counts:
        for label, batch, patches in variants:
            if expired >= 100_000 and label.startswith("as is"):
                continue  # measured by `bench.run` (about a minute)
            bench.sql("TRUNCATE checkpoints")
            bench.sql(
                "UPDATE work_items SET status = 'completed', completed_at = now(), "
                "retry_count = 0, error_message = NULL, lease_holder = NULL, "
                "lease_expires_at = NULL "
                "WHERE status IN ('pending', 'failed') AND retry_count > 0"
            )
            bench.expire(expired)
            bench.vacuum_analyze()
            bench.vacuum_analyze("checkpoints")
            sweep = RecoverySweep(
                scan_interval_seconds=60,
                batch_size=batch,
                create_checkpoints="no checkpoints" not in label,
            )
            with contextlib.ExitStack() as stack:
                for target, name, value in patches:
                    stack.enter_context(patched(target, name, value))
                times = stack.enter_context(statement_times())
                start = time.perf_counter()
                stats = sweep.scan_and_recover()
                wall_ms = (time.perf_counter() - start) * 1000
            if stats.recovered != expired or stats.errors:
                raise SystemExit(f"{label}: recovered {stats.recovered} of {expired}")
            result = {
                "experiment": "sweep",
                "rows": rows,
                "expired": expired,
                "variant": label,
                "wall_ms": round(wall_ms, 1),
                "batches": stats.batches,
                "statements": breakdown(times),
            }
            progress(f"  {expired} expired, {label}: {wall_ms:.1f} ms")
            emit(result)
            results.append(result)
    return results


# --- enqueue ------------------------------------------------------------------------------------


def experiment_enqueue(bench: Any, n: int) -> list[dict[str, Any]]:
    """enqueue_many of n items, and where its time goes (measured piece by piece)."""
    import json as jsonlib

    from django.db import connection

    from leasing import validation
    from leasing.enqueue import _COLUMNS, enqueue_many
    from leasing.ids import new_ulid
    from leasing.models import WorkItem

    specs = [
        {"task_id": f"task-{i}", "work_type": "bench.noop", "input_data": {"i": i}}
        for i in range(n)
    ]
    results = []

    def record(label: str, seconds: float, **extra: Any) -> None:
        result = {"experiment": "enqueue", "items": n, "variant": label,
                  "seconds": round(seconds, 3), **extra}  # fmt: skip
        progress(f"  enqueue {label}: {seconds:.3f} s")
        emit(result)
        results.append(result)

    bench.reset()
    bench.vacuum_analyze()
    with statement_times() as times:
        start = time.perf_counter()
        enqueue_many(specs)
        total = time.perf_counter() - start
    record("enqueue_many as is", total, statements=breakdown(times))

    start = time.perf_counter()
    ids = [new_ulid() for _ in range(n)]
    record("piece: new_ulid() x n", time.perf_counter() - start)

    start = time.perf_counter()
    for spec in specs:
        validation.payload("input_data", spec["input_data"])
    record("piece: validation.payload() x n (json.dumps with kwargs)", time.perf_counter() - start)

    encoder = jsonlib.JSONEncoder(separators=(",", ":"), allow_nan=False)
    start = time.perf_counter()
    outputs = [encoder.encode(spec["input_data"]) for spec in specs]
    record("piece: one shared JSONEncoder.encode() x n", time.perf_counter() - start)

    start = time.perf_counter()
    for i, spec in enumerate(specs):
        WorkItem(work_item_id=ids[i], task_id=spec["task_id"], work_type="bench.noop",
                 status="pending", priority=0, lease_token=0, retry_count=0, max_retries=3,
                 run_after=None, queue_name="default", input_data=spec["input_data"],
                 created_at=None, updated_at=None)  # fmt: skip
    record("piece: WorkItem(**kwargs) x n", time.perf_counter() - start)

    names = [f.attname for f in WorkItem._meta.concrete_fields]
    start = time.perf_counter()
    for i, spec in enumerate(specs):
        values = dict.fromkeys(names)
        values.update(work_item_id=ids[i], task_id=spec["task_id"], work_type="bench.noop",
                      status="pending", priority=0, lease_token=0, retry_count=0, max_retries=3,
                      queue_name="default", input_data=spec["input_data"])  # fmt: skip
        WorkItem.from_db("default", names, [values[k] for k in names])
    record("piece: WorkItem.from_db(positional) x n", time.perf_counter() - start)

    insert = f"""
        INSERT INTO work_items ({_COLUMNS})
        SELECT v.id, v.task_id, v.work_type, 'pending', v.priority, 0, 0,
               v.max_retries, v.run_after, v.queue_name, v.input::jsonb,
               statement_timestamp(), statement_timestamp()
        FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::int[],
                    %s::timestamptz[], %s::text[], %s::text[])
             AS v(id, task_id, work_type, priority, max_retries, run_after, queue_name, input)
    """
    params = [ids, [s["task_id"] for s in specs], ["bench.noop"] * n, [0] * n, [3] * n,
              [None] * n, ["default"] * n, outputs]  # fmt: skip
    one_row = f"WITH ins AS ({insert} RETURNING 1) SELECT count(*), statement_timestamp() FROM ins"
    every_row = insert + " RETURNING work_item_id, created_at, updated_at"
    for label, sql, raw in (
        ("piece: INSERT ... RETURNING every row (Django cursor)", every_row, False),
        ("piece: INSERT, one row back (Django cursor)", one_row, False),
        ("piece: INSERT, one row back (psycopg server-side binding)", one_row, True),
    ):
        bench.reset()
        bench.vacuum_analyze()
        start = time.perf_counter()
        if raw:
            connection.ensure_connection()
            with connection.connection.cursor() as cur:
                cur.execute(sql, params)
                cur.fetchall()
        else:
            with connection.cursor() as cur:
                cur.execute(sql, params)
                rows = cur.fetchall()
                if "created_at" in sql:
                    from leasing.db import to_datetime

                    [to_datetime(r[1]) for r in rows]
        record(label, time.perf_counter() - start)
    return results


# --- claim ---------------------------------------------------------------------------------------


def experiment_claim(bench: Any, count: int) -> list[dict[str, Any]]:
    """Where one acquire_leases(1) round trip spends its time, single claimer."""
    from django.db import connection

    from leasing.lease import LeaseManager

    results = []
    bench.reset()
    bench.enqueue_noop(count * 8 + 100)
    bench.vacuum_analyze()
    manager = LeaseManager("proposal-claimer")
    captured: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        captured.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        manager.acquire_leases(1, 300, work_type_filter=["bench.noop"])
    sql, params = captured[-1]
    connection.ensure_connection()
    raw = connection.connection

    def timed(label: str, fn: Callable[[], Any]) -> None:
        durations = []
        for _ in range(count):
            start = time.perf_counter()
            fn()
            durations.append((time.perf_counter() - start) * 1000)
        result = {"experiment": "claim", "variant": label, "ms": summary_ms(durations, 3)}
        progress(f"  claim {label}: {result['ms']}")
        emit(result)
        results.append(result)

    def library() -> None:
        manager.acquire_leases(1, 300, work_type_filter=["bench.noop"])

    def raw_claim() -> None:
        with raw.cursor() as cur:
            cur.execute(sql, params)
            cur.fetchall()

    for _ in range(2):
        bench.sql("SET synchronous_commit = on")
        timed("SELECT 1 round trip (Django cursor)", lambda: bench.sql("SELECT 1"))
        timed("acquire_leases(1) as is", library)
        timed("same claim SQL, raw psycopg cursor (server-side binding)", raw_claim)
        bench.sql("SET synchronous_commit = off")
        timed("acquire_leases(1), synchronous_commit=off", library)
        timed("raw psycopg cursor, synchronous_commit=off", raw_claim)
        bench.sql("SET synchronous_commit = on")
    return results


# --- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.proposals", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("experiment", choices=["sweep", "enqueue", "claim", "all"])
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    )
    parser.add_argument("--database", default="leasing_bench_proposals")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--expired", default="1000,100000")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)

    from bench.run import Bench, parse_args

    bench = Bench(parse_args(["--database-url", args.database_url, "--database", args.database]
                             + (["--keep"] if args.keep else [])))  # fmt: skip
    install_cleanup(bench.teardown)
    try:
        bench.setup()
        if args.experiment in ("sweep", "all"):
            experiment_sweep(bench, args.rows, [int(x) for x in args.expired.split(",")])
        if args.experiment in ("enqueue", "all"):
            experiment_enqueue(bench, args.items)
        if args.experiment in ("claim", "all"):
            experiment_claim(bench, args.claims)
    finally:
        bench.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
