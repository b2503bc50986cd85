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

Autovacuum is held off on the table (`autovacuum_enabled = false`) while a
burst runs, and let go once the statistics hold all of it: what the test
decides on is then the thresholds, not where autovacuum's naptime falls
against the drain (an analyze in the middle of one resets the table's count
of dead rows to what it finds at that moment).
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
HOLD = "ALTER TABLE work_items SET (autovacuum_enabled = false)"
LET_GO = "ALTER TABLE work_items RESET (autovacuum_enabled)"


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


def burst(fleet: Fleet, cluster: Cluster, prefix: str) -> int:
    """BURST items enqueued, then drained by one real worker (`--burst` exits when done),
    with autovacuum held off on work_items; returns the dead row versions it left."""
    cluster.execute(HOLD)
    _, _, updated = settled(cluster)
    fleet.manage("ha_enqueue", "--count", str(BURST), "--prefix", prefix, "--effect-every", "0")
    fleet.manage("runworker", "--burst", "--concurrency", "4", timeout=300)
    # Each claim and each completion leaves one dead row version.
    wait_until(
        lambda: stats(cluster)[2] - updated >= 2 * BURST,
        timeout=30,
        message="the burst's claims and completions in pg_stat_user_tables",
    )
    return stats(cluster)[1]


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

    # The history: HISTORY finished items.
    fleet.manage(
        "ha_enqueue", "--count", str(HISTORY), "--prefix", "history", "--effect-every", "0"
    )
    cluster.execute(
        "UPDATE work_items SET status = 'completed', started_at = statement_timestamp(), "
        "completed_at = statement_timestamp()"
    )

    dead = burst(fleet, cluster, "burst")
    assert scalar(dsn, "SELECT count(*) FROM work_items WHERE status = 'completed'") == (
        HISTORY + BURST
    )
    # Over the shipped threshold, under the default one.
    assert SHIPPED_THRESHOLD < dead < DEFAULT_THRESHOLD, dead
    vacuums = stats(cluster)[0]
    cluster.execute(LET_GO)
    wait_until(
        lambda: stats(cluster)[0] > vacuums,
        timeout=60,
        message=lambda: f"autovacuum of work_items; (autovacuums, dead, updated) {stats(cluster)}",
    )
    wait_until(lambda: stats(cluster)[1] < SHIPPED_THRESHOLD, timeout=30, message="dead rows")

    # The control: the server's defaults, the same burst on the same table.
    cluster.execute(f"ALTER TABLE work_items RESET ({', '.join(VACUUM_OPTIONS)})")
    dead_control = burst(fleet, cluster, "control")
    assert SHIPPED_THRESHOLD < dead_control < DEFAULT_THRESHOLD, dead_control
    vacuums = stats(cluster)[0]
    cluster.execute(LET_GO)
    # Ten naptimes: autovacuum looks at the table ten times and leaves it.
    time.sleep(10)
    control = stats(cluster)
    record_result(
        "autovacuum",
        dead_after_burst=dead,
        dead_after_control_burst=dead_control,
        dead_10s_after_burst_defaults=control[1],
    )
    assert control[0] == vacuums, "the defaults vacuumed as early as the shipped settings"
