"""heartbeat: `renew_leases()` of 1,000 held leases in a loop: renewals/s and HOT share."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from bench.common import BenchError, summary_ms
from bench.context import Bench
from bench.report import Row

MIN_ROUNDS = 10


def hot_counters(bench: Bench) -> tuple[int, int]:
    """(n_tup_upd, n_tup_hot_upd) of work_items, with this backend's own stats flushed."""
    bench.sql("SELECT pg_stat_force_next_flush()")
    bench.sql("SELECT 1")
    bench.sql("SELECT pg_stat_clear_snapshot()")
    row = bench.sql(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'work_items'"
    )[0]
    return int(row[0]), int(row[1])


def renew_rounds(
    bench: Bench, manager: Any, seconds: float, extend_below: float | None = None
) -> dict[str, Any]:
    from django.db import connection

    held = len(manager.held_leases())
    upd0, hot0 = hot_counters(bench)
    durations = []
    renewed = lost = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    # Rounds, not only seconds: the first round of freshly packed pages finds no room for
    # a HOT update, the later ones do, so the share of a run with two rounds (a slow phase
    # of a quick run) says little; ten make it a property of the statement, not the host.
    while time.perf_counter() < deadline or len(durations) < MIN_ROUNDS:
        t0 = time.perf_counter()
        ok, gone = manager.renew_leases(None, 300, extend_below=extend_below)
        durations.append((time.perf_counter() - t0) * 1000)
        renewed += len(ok)
        lost += len(gone)
    elapsed = time.perf_counter() - start
    upd1, hot1 = hot_counters(bench)
    connection.close()
    d_upd, d_hot = upd1 - upd0, hot1 - hot0
    return {
        "leases": held,
        "rounds": len(durations),
        "renewed": renewed,
        "lost": lost,
        "renewals_per_s": round(renewed / elapsed),
        "round_ms": summary_ms(durations, 2),
        "n_tup_upd": d_upd,
        "n_tup_hot_upd": d_hot,
        "hot_share": round(d_hot / d_upd, 3) if d_upd else None,
    }


def run(bench: Bench) -> dict[str, Any]:
    from leasing import LeaseManager

    n = bench.sizes.heartbeat_leases
    seconds = bench.sizes.heartbeat_seconds
    bench.reset()
    bench.enqueue_noop(n)
    bench.vacuum_analyze()
    manager = LeaseManager("bench-heartbeat")
    while len(manager.held_leases()) < n:
        more = manager.acquire_leases(
            min(n - len(manager.held_leases()), 1000), 300, work_type_filter=["bench.noop"]
        )
        if not more:
            break
    if len(manager.held_leases()) != n:
        raise BenchError(f"could claim only {len(manager.held_leases())} of {n} leases")
    bench.vacuum_analyze()
    # What runworker's renewer does: extend only when under half the lease
    # is left, so the indexed expiry stays put and the update can be HOT.
    # In steady state (a renewal every lease/10) one renewal in five or six
    # extends; this loop runs within the first half of the lease, so it
    # shows the cost and HOT share of the renewals that do not.
    worker_renewer = renew_rounds(bench, manager, seconds, extend_below=150)
    # renew_lease() semantics: every renewal moves the expiry (never HOT,
    # since work_items_lease_expiry_idx indexes it).
    as_migrated = renew_rounds(bench, manager, seconds)
    # What-if, in this throwaway database only: without the partial index on
    # lease_expires_at, no index covers a column a renewal changes, so
    # PostgreSQL can use HOT updates (given free space in the page).
    variants: dict[str, Any] = {}
    with without_lease_expiry_index(bench) as dropped:
        if dropped:
            bench.vacuum_analyze()
            variants["no_lease_expiry_idx"] = renew_rounds(bench, manager, seconds)
            bench.sql("ALTER TABLE work_items SET (fillfactor = 70)")
            try:
                bench.sql("VACUUM FULL work_items")
                bench.vacuum_analyze()
                variants["no_lease_expiry_idx_fillfactor70"] = renew_rounds(bench, manager, seconds)
            finally:
                bench.sql("ALTER TABLE work_items RESET (fillfactor)")
    if as_migrated["lost"]:
        raise BenchError(f"{as_migrated['lost']} leases were lost while renewing")
    return {
        "measures": "LeaseManager.renew_leases() of every held lease (one UPDATE ... FROM "
        "unnest per 1000) in a loop; HOT share = delta n_tup_hot_upd / delta n_tup_upd of "
        "work_items over the loop. What-ifs (this throwaway database only): without "
        "work_items_lease_expiry_idx no index covers a column a renewal changes",
        "worker_renewer": worker_renewer,
        "as_migrated": as_migrated,
        "what_if": variants,
    }


@contextlib.contextmanager
def without_lease_expiry_index(bench: Bench) -> Iterator[bool]:
    """Drop work_items_lease_expiry_idx for a what-if measurement; put it back after."""
    index_sql = bench.one(
        "SELECT pg_get_indexdef(indexrelid) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = 'work_items_lease_expiry_idx'"
    )
    if not index_sql:
        yield False
        return
    bench.sql("DROP INDEX work_items_lease_expiry_idx")
    try:
        yield True
    finally:
        bench.sql(index_sql)


def _renewal_summary(w: dict[str, Any]) -> str:
    return (
        f"{w['renewals_per_s']:,} renewals/s, round p50 {w['round_ms']['p50']} ms, "
        f"HOT {w['hot_share']}"
    )


def rows(r: dict[str, Any]) -> Iterator[Row]:
    w, a = r["worker_renewer"], r["as_migrated"]
    yield Row(
        f"renew_leases {w['leases']} leases, runworker renewer (keeps expiry)", _renewal_summary(w)
    )
    yield Row(f"renew_leases {a['leases']} leases, every renewal extends", _renewal_summary(a))
    for label, v in r.get("what_if", {}).items():
        yield Row(f"  what-if {label}", _renewal_summary(v))
