"""Autovacuum on, as on a production server: the per-table settings the migrations ship.

The development server runs without autovacuum, so the rest of the suite and
the bench never see it. Here a throwaway cluster runs it (`autovacuum = on`,
a naptime of 1 s so the test need not wait a minute). Migration 0004 tells
autovacuum to vacuum `work_items` after 1,000 + 2% of its rows are dead (the
server's default is 50 + 20%): every claimed item leaves a dead entry at the
front of the claim index until a vacuum removes it, and each claim walks past
those entries (BENCHMARKS.md measures the cost). On a table of 100,000
finished items, a burst of 4,000 items drained by a real worker leaves about
8,000 dead row versions: enough for the shipped settings, under half what the
defaults wait for. The same burst with the settings reset is the control.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from .clusters import Cluster
from .helpers import db_env, query, record_result, scalar, wait_until
from .processes import Fleet

HISTORY = 100_000
BURST = 4_000
# The vacuum settings 0004 sets on work_items (reset for the control run).
VACUUM_OPTIONS = (
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_insert_scale_factor",
)
STATS = (
    "SELECT autovacuum_count, n_dead_tup, n_tup_upd FROM pg_stat_user_tables "
    "WHERE relname = 'work_items'"
)
SHIPPED_THRESHOLD = 1_000 + 0.02 * HISTORY  # dead rows before autovacuum, as shipped
DEFAULT_THRESHOLD = 50 + 0.2 * HISTORY  # the server's defaults


@pytest.fixture
def autovacuuming(fleet: Fleet) -> Iterator[Cluster]:
    cluster = Cluster.create_primary(
        "av", settings={"autovacuum": "on", "autovacuum_naptime": "1s"}
    )
    try:
        yield cluster
    finally:
        fleet.kill_all()
        cluster.drop()


def stats(cluster: Cluster) -> tuple[int, int, int]:
    """work_items' (autovacuums so far, dead row versions now, rows updated so far)."""
    autovacuums, dead, updated = query(cluster.dsn(), STATS)[0]
    return int(autovacuums), int(dead), int(updated)


def settled(cluster: Cluster) -> tuple[int, int, int]:
    """Vacuum and analyze by hand, and wait until the statistics show it (they lag a little)."""
    cluster.execute("VACUUM ANALYZE work_items")
    wait_until(lambda: stats(cluster)[1] == 0, timeout=30, message="n_dead_tup back to 0")
    return stats(cluster)


def burst(fleet: Fleet, prefix: str) -> None:
    """BURST items enqueued, then drained by one real worker (`--burst` exits when done)."""
    fleet.manage("ha_enqueue", "--count", str(BURST), "--prefix", prefix, "--effect-every", "0")
    fleet.manage("runworker", "--burst", "--concurrency", "4", timeout=300)


def test_shipped_settings_get_work_items_vacuumed_after_a_burst(
    fleet: Fleet, autovacuuming: Cluster
) -> None:
    cluster = autovacuuming
    dsn = cluster.dsn()
    fleet.env.update(db_env(["127.0.0.1"], [cluster.port]))
    fleet.manage("migrate", "-v", "0")
    assert scalar(dsn, "SHOW autovacuum") == "on"
    options = scalar(dsn, "SELECT reloptions FROM pg_class WHERE relname = 'work_items'")
    assert "autovacuum_vacuum_scale_factor=0.02" in options
    assert "autovacuum_vacuum_threshold=1000" in options

    # The history: HISTORY finished items, vacuumed and analyzed (a settled table).
    fleet.manage(
        "ha_enqueue", "--count", str(HISTORY), "--prefix", "history", "--effect-every", "0"
    )
    cluster.execute(
        "UPDATE work_items SET status = 'completed', started_at = statement_timestamp(), "
        "completed_at = statement_timestamp()"
    )
    vacuums, _, updated = settled(cluster)

    burst(fleet, "burst")
    assert scalar(dsn, "SELECT count(*) FROM work_items WHERE status = 'completed'") == (
        HISTORY + BURST
    )
    # The burst's claims and completions (each leaves a dead row version) are
    # over the shipped threshold and under the default one.
    wait_until(
        lambda: stats(cluster)[2] - updated >= 2 * BURST,
        timeout=30,
        message="the burst's claims and completions in pg_stat_user_tables",
    )
    burst_updates = stats(cluster)[2] - updated
    assert SHIPPED_THRESHOLD < burst_updates < DEFAULT_THRESHOLD, burst_updates
    # Autovacuum comes (perhaps already during the drain) and leaves the table under it.
    wait_until(
        lambda: stats(cluster)[0] > vacuums and stats(cluster)[1] < SHIPPED_THRESHOLD,
        timeout=60,
        message=lambda: f"autovacuum of work_items; (autovacuums, dead, updated) {stats(cluster)}",
    )
    shipped = stats(cluster)

    # The control: the server's defaults, the same burst on the same table.
    cluster.execute(f"ALTER TABLE work_items RESET ({', '.join(VACUUM_OPTIONS)})")
    vacuums, _, _ = settled(cluster)
    burst(fleet, "control")
    # Ten naptimes: autovacuum looks at the table ten times and leaves it.
    time.sleep(10)
    control = stats(cluster)
    record_result(
        "autovacuum",
        burst_updates=burst_updates,
        dead_after_autovacuum_shipped=shipped[1],
        dead_10s_after_burst_defaults=control[1],
    )
    assert control[0] == vacuums, "the defaults vacuumed as early as the shipped settings"
    assert control[1] > SHIPPED_THRESHOLD, control
