"""What the HA tests share: the subprocess environment, waiting, and the exactly-once audit."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from .processes import ROOT

ARTIFACTS = ROOT / "artifacts" / "ha"

# Settings shared by the HA runs: short leases so that recovery is quick,
# retries plentiful so that an outage never fails an item for good.
FAST_LEASING = {
    "LEASE_DURATION": 5,
    "HEARTBEAT_INTERVAL": 1,
    "HEARTBEAT_MAX_FAILURES": 3,
    "SWEEP_INTERVAL": 1,
    "POLL_INTERVAL": 0.2,
    "MAX_RETRIES": 20,
}


def db_env(
    hosts: list[str],
    ports: list[int],
    *,
    dbname: str = "leasing_ha",
    pooled: bool = False,
    direct: tuple[str, int] | None = None,
    leasing: dict[str, Any] | None = None,
    tcp_timeout_ms: int = 3000,
) -> dict[str, str]:
    """Environment variables that point tests.ha.settings at a topology."""
    env = {
        "HA_DB_HOST": ",".join(hosts),
        "HA_DB_PORT": ",".join(str(p) for p in ports),
        "HA_DB_NAME": dbname,
        "HA_DB_POOLED": "1" if pooled else "0",
        "HA_LEASING": json.dumps({**FAST_LEASING, **(leasing or {})}),
        "HA_TCP_TIMEOUT_MS": str(tcp_timeout_ms),
    }
    if direct is not None:
        env["HA_DIRECT_HOST"], env["HA_DIRECT_PORT"] = direct[0], str(direct[1])
    return env


def wait_until(
    predicate: Callable[[], Any],
    *,
    timeout: float,
    interval: float = 0.25,
    message: str | Callable[[], str] = "condition not met",
) -> Any:
    """Call `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except psycopg.OperationalError:
            value = None  # the database is between primaries: ask again
        if value:
            return value
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:g}s: {text}")
        time.sleep(interval)


def query(dsn: str, sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def scalar(dsn: str, sql: str, params: tuple = ()) -> Any:
    return query(dsn, sql, params)[0][0]


@dataclass(frozen=True)
class Audit:
    """The state of a run as the database records it."""

    statuses: dict[str, int]
    effects: int  # distinct effect keys in the ledger
    ledger_rows: int
    duplicated_keys: list[tuple[str, int]]
    keys_not_completed: int  # idempotency keys not `completed` for a completed item

    @property
    def completed(self) -> int:
        return self.statuses.get("completed", 0)


def audit(dsn: str) -> Audit:
    statuses = dict(query(dsn, "SELECT status, count(*) FROM work_items GROUP BY status"))
    effects, rows = query(dsn, "SELECT count(DISTINCT effect_key), count(*) FROM ha_ledger")[0]
    duplicated = query(
        dsn,
        "SELECT effect_key, count(*) FROM ha_ledger GROUP BY effect_key HAVING count(*) > 1 "
        "ORDER BY effect_key LIMIT 20",
    )
    not_completed = scalar(dsn, "SELECT count(*) FROM idempotency_keys WHERE status <> 'completed'")
    return Audit(statuses, effects, rows, duplicated, not_completed)


def overdue_leases(dsn: str) -> float:
    """Seconds the most overdue `in_progress` lease is past its expiry (0 if none)."""
    value = scalar(
        dsn,
        "SELECT coalesce(max(extract(epoch FROM statement_timestamp() - lease_expires_at)), 0) "
        "FROM work_items WHERE status = 'in_progress' AND lease_expires_at < statement_timestamp()",
    )
    return float(value)


def registered_workers(dsn: str) -> int:
    """Worker processes that registered and have not stopped.

    `lost` counts too: under load the sweep may call a busy process lost for a
    moment before its next beat (it comes back `running` by itself).
    """
    return int(
        scalar(
            dsn,
            "SELECT count(*) FROM workers WHERE role = 'worker' AND status IN ('running', 'lost')",
        )
    )


def record_result(name: str, **values: Any) -> None:
    """Print a measured figure and keep it in artifacts/ha/results.jsonl."""
    line = json.dumps({"test": name, **values}, sort_keys=True, default=str)
    print(f"\nHA RESULT {line}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with open(ARTIFACTS / "results.jsonl", "a") as f:
        f.write(line + "\n")


def describe_duplicates(dsn: str, keys: list[str], since: float) -> str:
    """The ledger rows of duplicated effect keys, times relative to `since` (epoch seconds)."""
    rows = query(
        dsn,
        "SELECT effect_key, lease_token, worker_id, "
        "round((extract(epoch FROM created_at) - %s)::numeric, 3) "
        "FROM ha_ledger WHERE effect_key = ANY(%s) ORDER BY effect_key, id",
        (since, keys),
    )
    return "\n".join(f"  {k} token {t} by {w} at {at:+} s" for k, t, w, at in rows)
