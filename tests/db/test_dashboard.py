"""The dashboard and the checkpoint timeline: numbers, pages, access."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from leasing import LeaseManager, create_checkpoint, enqueue
from leasing import console as dashboard
from leasing.console import census
from leasing.console.backlog import pending_pairs
from leasing.models import Worker, WorkItem
from tests.support.admin import (
    PAYLOAD,
    SECRET,
    VIEW_ALL,
    claim,
    dashboard_url,
    lease_scenario,
    make_user,
    register_holders,
    shift,
    timeline_url,
)
from tests.support.helpers import database_now
from tests.support.spec_sql import ACTIVE_AND_STALE, RETRY_DISTRIBUTION, TIMELINE, run

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer() -> Client:
    client = Client()
    client.force_login(make_user("viewer", *VIEW_ALL))
    return client


def finish(task_id: str, *, retries: int = 0, success: bool = True, max_retries: int = 3) -> str:
    """Run an item through `retries` failed attempts (with retry) and a final release."""
    lease = claim(task_id, "worker-1", max_retries=max_retries)
    manager = LeaseManager("worker-1")
    for _ in range(retries):
        manager.release_lease(lease.work_item_id, False, error="try again", retry=True,
                              token=lease.token)  # fmt: skip
        WorkItem.objects.filter(pk=lease.work_item_id).update(run_after=None)
        lease = manager.acquire_lease(task_id_filter=task_id)
    manager.release_lease(lease.work_item_id, success, error=None if success else "gave up",
                          token=lease.token)  # fmt: skip
    return lease.work_item_id


def register(worker_id: str, role: str = "worker", **fields) -> None:
    Worker.objects.create(worker_id=worker_id, role=role, hostname="host", pid=1, **fields)


# --- the service ---------------------------------------------------------


def test_lease_health_splits_the_in_progress_items():
    lease_scenario()
    register_holders()
    health = dashboard.lease_health()
    assert health.active == 4
    assert health.stale == 2  # heartbeat older than 3 x 30 s: the stale and the expired lease
    assert (health.healthy, health.stale_live, health.at_risk, health.expired) == (2, 1, 0, 1)
    assert health.healthy + health.stale_live + health.at_risk + health.expired == health.active
    assert health.no_progress == 1  # heartbeat fresh, no beat for 10 min
    assert health.stale_after_seconds == 90  # three of the 30 s heartbeat intervals


def test_leases_of_a_silent_lost_or_unknown_holder_are_at_risk_never_healthy():
    lease_scenario()
    register_holders("worker-2", "worker-3")  # worker-1 (healthy, stuck) has no row
    health = dashboard.lease_health()
    assert (health.healthy, health.at_risk, health.no_progress) == (0, 2, 0)
    register_holders("worker-1", status="lost")
    assert dashboard.lease_health().at_risk == 2
    register_holders("worker-1")
    Worker.objects.filter(pk="worker-1").update(last_seen_at=database_now() - timedelta(seconds=91))
    assert dashboard.lease_health().at_risk == 2  # silent: not seen for 3 x 30 s
    Worker.objects.filter(pk="worker-1").update(last_seen_at=database_now())
    assert dashboard.lease_health().at_risk == 0


def test_stale_threshold_follows_each_types_heartbeat_capped_by_the_setting(leasing_settings):
    from leasing.handlers import registry

    scenario = lease_scenario()
    register_holders()
    shift(scenario.healthy.work_item_id, heartbeat_at=-20)
    registry.register("send_invoice", lambda ctx: None, heartbeat_interval=5, lease_duration=45)
    try:
        health = dashboard.lease_health()
        assert health.thresholds["send_invoice"] == 15  # 3 x 5 s
        assert (health.healthy, health.stale_live) == (1, 2)  # the 20 s old beat is stale
    finally:
        registry.unregister("send_invoice")
    leasing_settings(STALE_HEARTBEAT=500)
    health = dashboard.lease_health()
    assert health.stale_after_seconds == 90  # a few intervals, never later than the setting
    leasing_settings(STALE_HEARTBEAT=60)
    health = dashboard.lease_health()
    assert (health.stale, health.stale_live, health.stale_after_seconds) == (2, 1, 60)


def test_backlog_counts_deferred_items_and_ages_the_oldest_claimable_one():
    now = database_now()
    old = enqueue("t-old", "noop")
    enqueue("t-new", "noop")
    enqueue("t-later", "noop", run_after=now + timedelta(hours=1))
    shift(old.pk, created_at=-3600)
    backlog = dashboard.backlog()
    assert (backlog.pending, backlog.deferred, backlog.claimable) == (3, 1, 2)
    assert backlog.oldest_created_at == WorkItem.objects.get(pk=old.pk).created_at
    assert 3599 <= backlog.oldest_age_seconds < 3700


def test_empty_tables_give_zeros_not_errors():
    data = dashboard.build_dashboard()
    assert data.lease_health.active == 0
    assert data.backlog.oldest_age_seconds is None
    assert data.retries.buckets == ()
    assert data.statuses.total == 0
    assert not data.sweep.ok


def test_retry_distribution_splits_completed_and_failed_by_retry_count():
    finish("a")
    finish("b")
    finish("c", retries=1)
    finish("d", retries=2)
    finish("e", retries=3, success=False)
    finish("f", success=False)
    dist = dashboard.retry_distribution()
    assert [(b.retry_count, b.completed, b.failed) for b in dist.buckets] == [
        (0, 2, 1),
        (1, 1, 0),
        (2, 1, 0),
        (3, 0, 1),
    ]
    assert dist.counts() == {0: 3, 1: 1, 2: 1, 3: 1}
    census = dashboard.item_census()
    assert census.retries == dist
    assert census.statuses.completed == 4 and census.statuses.failed == 2
    # Every claim added one to a token: 6 items, 6 retries.
    assert census.claims_total == 12


def test_the_dashboard_retry_distribution_is_that_of_its_window(viewer):
    finish("a")
    finish("b", retries=1)
    shift(finish("old", retries=2), completed_at=-2 * 3600)  # outside the 1 h window
    hour = dashboard.build_dashboard(window_minutes=60)
    assert hour.retries.counts() == {0: 1, 1: 1}
    day = dashboard.build_dashboard(window_minutes=1440)
    assert day.retries.counts() == {0: 1, 1: 1, 2: 1}
    # The monitoring query over every finished item is still there, exact.
    assert dashboard.retry_distribution().counts() == {0: 1, 1: 1, 2: 1}
    # Items by status count every item, whatever the window.
    assert (hour.statuses.completed, hour.statuses.estimated) == (3, frozenset())
    html = viewer.get(dashboard_url("window=60")).content.decode()
    assert "in the last 1 h, by number of retries" in html


def test_the_status_counts_are_read_in_two_round_trips_at_most():
    for n in range(3):
        finish(f"done-{n}")
    finish("gone", success=False)
    with CaptureQueriesContext(connection) as captured:
        counts = census.status_counts(("completed", "failed", "cancelled"))
    assert counts == {"completed": (3, False), "failed": (1, False), "cancelled": (0, False)}
    assert len(captured.captured_queries) <= 2  # estimates, then the capped counts


@pytest.mark.postgres
def test_large_finished_counts_are_the_planners_estimate_and_say_so(monkeypatch, viewer):
    for n in range(6):
        finish(f"done-{n}")
    finish("gone", success=False)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE work_items")  # the planner's statistics see the 7 rows
    monkeypatch.setattr(census, "EXACT_COUNT_LIMIT", 2)
    data = dashboard.build_dashboard()
    # 6 completed is past 2 x the limit: estimated; 1 failed is counted exactly.
    assert data.statuses.estimated == frozenset({"completed"})
    assert data.statuses.completed == census.status_count("completed")[0] > 2
    assert (data.statuses.failed, census.status_count("failed")) == (1, (1, False))
    html = viewer.get(dashboard_url()).content.decode()
    assert "estimated by the database planner" in html
    assert re.search(r"status__exact=completed\">about \d+<", html)
    assert re.search(r"status__exact=failed\">1<", html)
    monkeypatch.setattr(census, "EXACT_COUNT_LIMIT", 10_000)
    assert dashboard.build_dashboard().statuses == census.StatusCounts(
        pending=0, in_progress=0, completed=6, failed=1
    )


def test_throughput_buckets_completions_and_failures_by_completed_at():
    for offset in (-30, -400, -2000, -4000):
        shift(finish(f"ok{offset}"), completed_at=offset)
    shift(finish("bad", success=False), completed_at=-100)
    hour = dashboard.throughput(window_minutes=60)
    assert (hour.bucket_minutes, len(hour.buckets)) == (5, 12)
    assert (hour.completed, hour.failed) == (3, 1)  # -4000 s is outside the hour
    assert sum(b.completed for b in hour.buckets[-2:]) >= 1  # -30 s: one of the last two
    assert hour.buckets[-1].start <= database_now() < hour.buckets[-1].start + timedelta(minutes=5)
    quarter = dashboard.throughput(window_minutes=15)
    assert (quarter.bucket_minutes, len(quarter.buckets)) == (1, 15)
    assert (quarter.completed, quarter.failed) == (2, 1)
    with pytest.raises(ValueError):
        dashboard.throughput(window_minutes=7)


def test_sweep_health_warns_when_no_sweep_ran_for_three_intervals(leasing_settings):
    leasing_settings(SWEEP_INTERVAL=60)
    health = dashboard.sweep_health()
    assert not health.ok and "No recovery sweep has ever run" in health.message

    now = database_now()
    register("sweeper@h", role="sweeper", last_scan_at=now - timedelta(seconds=30), scans=4)
    health = dashboard.sweep_health()
    assert health.ok and health.seconds_since_last_scan < 60
    assert health.sweepers[0].worker_id == "sweeper@h"

    Worker.objects.filter(pk="sweeper@h").update(
        last_scan_at=now - timedelta(seconds=181), last_seen_at=now - timedelta(seconds=181)
    )
    health = dashboard.sweep_health()
    assert not health.ok and health.dead
    assert "watchdog looks dead" in health.message and health.threshold_seconds == 180
    assert health.sweepers[0].liveness.silent  # the row says the same as the banner


def test_sweep_is_ok_only_while_its_last_pass_is_within_one_and_a_half_intervals(
    leasing_settings,
):
    now = database_now()
    register("sweeper@h", role="sweeper", last_scan_at=now - timedelta(seconds=85), scans=4,
             heartbeat_interval=60)  # fmt: skip
    health = dashboard.sweep_health()
    assert health.ok and health.level == "ok"
    Worker.objects.filter(pk="sweeper@h").update(last_scan_at=now - timedelta(seconds=120))
    health = dashboard.sweep_health()
    assert not health.ok and not health.dead and health.level == "warn"
    assert "later than expected" in health.message


def test_live_workers_hold_their_leases_and_orphans_are_listed():
    scenario = lease_scenario()
    register("worker-1", concurrency=4)
    register("worker-2")
    register("worker-3", status="lost")
    register("worker-gone", status="stopped")  # holds nothing: not listed
    claim("task-orphan", "never-registered")
    workers, orphans = dashboard.live_workers()
    by_id = {w.worker_id: w for w in workers}
    # The lost holder stays listed, first, until the sweep recovers its lease.
    assert workers[0].worker_id == "worker-3"
    assert set(by_id) == {"worker-1", "worker-2", "worker-3"}
    assert by_id["worker-3"].leases_at_risk and not by_id["worker-1"].leases_at_risk
    assert by_id["worker-3"].lease_expires_in[0] < 0  # its lease expired 30 s ago
    assert 200 < by_id["worker-1"].lease_expires_in[0] <= 300
    assert by_id["worker-1"].lease_count == 2
    assert set(by_id["worker-1"].lease_ids) == {
        scenario.healthy.work_item_id,
        scenario.stuck.work_item_id,
    }
    assert by_id["worker-2"].lease_ids == (scenario.stale.work_item_id,)
    assert (by_id["worker-3"].lease_count, by_id["worker-3"].expired_lease_count) == (1, 1)
    [orphan] = orphans  # no row at all
    assert orphan.lease_holder == "never-registered" and orphan.lease_count == 1


def test_recoveries_carry_snapshots_only_when_asked():
    lease_scenario()
    [hidden] = dashboard.recent_recoveries()
    assert hidden.snapshot is None and hidden.metadata is None and not hidden.payload_included
    [shown] = dashboard.recent_recoveries(include_payloads=True)
    assert SECRET in shown.snapshot["error"]


def test_timeline_is_in_sequence_order_and_redacted_unless_asked():
    lease = claim("task-t")
    for step in range(3):
        create_checkpoint("task-t", "iteration_end", {"step": step, "s": SECRET}, lease=lease)
    timeline = dashboard.task_timeline("task-t")
    assert [e.sequence_number for e in timeline.entries] == [1, 2, 3]
    assert all(e.snapshot is None for e in timeline.entries)
    assert [i.work_item_id for i in timeline.items] == [lease.work_item_id]
    full = dashboard.task_timeline("task-t", include_payloads=True, limit=2)
    assert [e.snapshot["step"] for e in full.entries] == [1, 2]  # the newest two
    assert full.total == 3 and full.truncated


@pytest.mark.postgres
def test_the_pending_pairs_are_read_without_parallel_workers():
    for n in range(3):
        enqueue(f"p{n}", "send_invoice", {})
    enqueue("q0", "resize_image", {}, queue_name="media")
    with connection.cursor() as cursor:  # a planner that reads them in parallel if it may
        cursor.execute("SELECT current_setting('server_version_num')::int")
        force = "debug_parallel_query" if cursor.fetchone()[0] >= 160000 else "force_parallel_mode"
        cursor.execute(f"SET LOCAL {force} = on")
        cursor.execute("SHOW max_parallel_workers_per_gather")
        before = cursor.fetchone()[0]
    with CaptureQueriesContext(connection) as captured:
        pairs = pending_pairs()
    assert {(p.queue_name, p.work_type, p.pending) for p in pairs} == {
        ("default", "send_invoice", 3),
        ("media", "resize_image", 1),
    }
    [sent] = [q["sql"] for q in captured.captured_queries if "MIN(" in q["sql"]]
    setting, read, restore = sent.split("; ")
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {read}")
        alone = " ".join(row[0] for row in cursor.fetchall())
        cursor.execute(f"{setting}; EXPLAIN {read}; {restore}")
        cursor.nextset()
        sent_plan = " ".join(row[0] for row in cursor.fetchall())
        cursor.execute("SHOW max_parallel_workers_per_gather")
        after = cursor.fetchone()[0]
    assert "Gather" in alone and "Gather" not in sent_plan
    assert after == before  # the caller's transaction goes on with its own setting


# --- the monitoring queries ----------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # now() is the statement's time, not a test transaction's
def test_dashboard_figures_equal_the_spec_13_sql():
    lease_scenario()
    finish("r1", retries=1)
    finish("r2", retries=2)
    finish("r3", retries=3, success=False)
    lease = claim("task-001", "worker-1", work_type="llm_agent")
    for kind in ("iteration_start", "llm_response", "tool_executed", "iteration_end"):
        create_checkpoint("task-001", kind, {"kind": kind}, lease=lease)
    superuser = Client()
    superuser.force_login(make_user("root", superuser=True))
    # All of it finished within the dashboard's default window (1 h).
    served = dashboard.build_dashboard()

    [(active, stale)] = run(ACTIVE_AND_STALE)
    health = dashboard.lease_health()
    assert (health.active, health.stale) == (active, stale) == (5, 2)

    spec_retries = dict(run(RETRY_DISTRIBUTION))
    dist = dashboard.retry_distribution()
    assert dist.counts() == served.retries.counts() == spec_retries == {0: 2, 1: 1, 2: 1, 3: 1}

    spec_timeline = run(TIMELINE)
    timeline = dashboard.task_timeline("task-001", include_payloads=True)
    assert [
        (e.checkpoint_type, e.sequence_number, e.snapshot, e.created_at)
        for e in timeline.entries
    ] == [(t, n, s if isinstance(s, dict) else json.loads(s), c)
          for t, n, s, c in spec_timeline]  # fmt: skip

    # The page renders the same numbers.
    html = superuser.get(dashboard_url()).content.decode()
    tiles = dict(
        re.findall(
            r'class="leasing-tile-label">([^<]+?)(?: <span[^>]*>[^<]*</span>)?</span>\s*'
            r'<span class="leasing-tile-value">([^<]+)</span>',
            html,
        )
    )
    assert tiles["Active leases"] == str(active)
    assert tiles["Stale heartbeats"] == str(stale)
    table = re.search(r'<table class="leasing-table" id="leasing-retry-table">(.*?)</table>',
                      html, re.S).group(1)  # fmt: skip
    rendered = {
        int(rc): int(total)
        for rc, total in re.findall(
            r'<tr><td class="num">(\d+)</td><td class="num">\d+</td>'
            r'<td class="num">\d+</td><td class="num">(\d+)</td></tr>',
            table,
        )
    }
    assert rendered == spec_retries
    page = superuser.get(timeline_url("task-001")).content.decode()
    sequence = [int(n) for n in re.findall(r'<span class="leasing-seq">#(\d+)</span>', page)]
    assert sequence == [n for _, n, _, _ in spec_timeline]


# --- the dashboard page ---------------------------------------------------------


def test_dashboard_page_shows_tiles_charts_workers_sweep_and_recoveries(viewer):
    scenario = lease_scenario()
    finish("r1", retries=1)
    register("worker-1")
    register("sweeper@h", role="sweeper", last_scan_at=database_now(), scans=3,
             last_scan_stats={"recovered": 2})  # fmt: skip
    response = viewer.get(dashboard_url())
    assert response.status_code == 200
    html = response.content.decode()
    for label in (
        "Active leases",
        "Stale heartbeats",
        "Expired, awaiting sweep",
        "Pending backlog",
        "Oldest pending",
        "Alive, no progress",
    ):
        assert f'<span class="leasing-tile-label">{label}' in html
    # The tiles link to the filtered work item list.
    assert 'href="/admin/leasing/workitem/?lease_health=expired"' in html
    # Server-side SVG charts, no script or external asset.
    assert '<svg class="leasing-chart" id="leasing-retry-chart"' in html
    assert '<svg class="leasing-chart" id="leasing-throughput-chart"' in html
    content = html.split('<div id="content-main" class="leasing-dashboard">')[1]
    assert "<script" not in content  # charts need no JavaScript
    assert not re.search(r'(src|href)="(https?:)?//', html)  # nothing from another host
    assert 'class="leasing-bar-completed"' in html
    assert "Recovery sweep OK." in html and "recovered=2" in html
    assert scenario.healthy.work_item_id in html  # a lease of worker-1
    assert "worker-3" in html and "no live row" in html  # the orphaned holder
    assert 'id="leasing-recoveries"' in html and "task-healthy" in html
    assert "Snapshot hidden" in html


def test_dashboard_warns_when_the_watchdog_is_dead(viewer, leasing_settings):
    leasing_settings(SWEEP_INTERVAL=30)
    register("sweeper@h", role="sweeper",
             last_scan_at=database_now() - timedelta(minutes=5))  # fmt: skip
    html = viewer.get(dashboard_url()).content.decode()
    assert 'role="alert"' in html
    assert "Warning: recovery sweep not running." in html
    assert "more than 3 of its 30 s intervals" in html


def test_dashboard_refreshes_itself_keeping_its_query_string(viewer):
    html = viewer.get(dashboard_url()).content.decode()
    assert '<meta http-equiv="refresh" content="5">' in html
    # A meta refresh without a URL reloads the same URL, query string included.
    html = viewer.get(dashboard_url("window=15&refresh=10")).content.decode()
    assert '<meta http-equiv="refresh" content="10">' in html
    assert '<option value="15" selected>' in html
    assert "Throughput, last 15 min" in html
    html = viewer.get(dashboard_url("refresh=0")).content.decode()
    assert 'http-equiv="refresh"' not in html and "auto-refresh off" in html


def test_dashboard_ignores_malformed_settings_with_a_message(viewer):
    response = viewer.get(dashboard_url("window=7&refresh=soon"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="leasing-ignored"' in html and "window=7:" in html
    assert "Throughput, last 1 h" in html
    assert '<meta http-equiv="refresh" content="5">' in html


def test_dashboard_is_linked_from_the_admin_index_and_the_list(viewer):
    index = viewer.get("/admin/").content.decode()
    assert 'href="/admin/leasing/workitem/dashboard/"' in index
    assert (
        'href="/admin/leasing/workitem/dashboard/"'
        in viewer.get("/admin/leasing/workitem/").content.decode()
    )
    nobody = Client()
    nobody.force_login(make_user("staff-without-perms"))
    assert "leasing-dashboard-link" not in nobody.get("/admin/").content.decode()


# --- the timeline page ---------------------------------------------------------


def test_timeline_page_lists_checkpoints_with_type_colours_and_links(viewer):
    lease = claim("task-t", "worker-1")
    create_checkpoint("task-t", "iteration_start", {"secret": SECRET}, lease=lease)
    create_checkpoint("task-t", "error_boundary", {"error": "x"}, lease=lease)
    html = viewer.get(timeline_url("task-t")).content.decode()
    assert re.findall(r'<span class="leasing-seq">#(\d+)</span>', html) == ["1", "2"]
    assert '<span class="leasing-badge leasing-cp-iteration_start">Iteration start</span>' in html
    assert '<span class="leasing-badge leasing-cp-error_boundary">Error boundary</span>' in html
    assert f'href="/admin/leasing/workitem/{lease.work_item_id}/change/"' in html
    assert "<time datetime=" in html
    assert "<details" not in html and SECRET not in html

    auditor = Client()
    auditor.force_login(make_user("auditor", *VIEW_ALL, PAYLOAD))
    html = auditor.get(timeline_url("task-t")).content.decode()
    assert html.count("<details data-key=") == 2 and "<summary>Snapshot</summary>" in html
    assert SECRET in html


def test_a_traceback_in_a_snapshot_reads_as_printed_under_its_json(viewer):
    lease = claim("task-tb", "worker-1")
    traceback = 'Traceback (most recent call last):\n  File "job.py", line 3\nValueError: <bad>'
    create_checkpoint(
        "task-tb", "error_boundary", {"error": {"traceback": traceback, "type": "ValueError"}},
        lease=lease,
    )  # fmt: skip
    assert "Traceback" not in viewer.get(timeline_url("task-tb")).content.decode()  # no payloads
    auditor = Client()
    auditor.force_login(make_user("auditor", *VIEW_ALL, PAYLOAD))
    html = auditor.get(timeline_url("task-tb")).content.decode()
    # In the JSON it is one line with escaped newlines; under it, as printed and escaped.
    assert "&quot;traceback&quot;: &quot;Traceback (most recent call last):\\n" in html
    shown = re.search(r'<pre class="leasing-text">(.*?)</pre>', html, re.S).group(1)
    assert shown == (
        "Traceback (most recent call last):\n  File &quot;job.py&quot;, line 3\n"
        "ValueError: &lt;bad&gt;"
    )
    assert "<strong>error.traceback</strong>" in html


def test_timeline_of_an_unknown_task_is_404(viewer):
    assert viewer.get(timeline_url("no-such-task")).status_code == 404


def test_task_ids_with_slashes_have_a_timeline(viewer):
    lease = claim("tenant/42/job", "worker-1")
    create_checkpoint("tenant/42/job", "iteration_start", {}, lease=lease)
    response = viewer.get(timeline_url("tenant/42/job"))
    assert response.status_code == 200 and "tenant/42/job" in response.content.decode()


# --- access ---------------------------------------------------------


def test_anonymous_users_are_sent_to_the_login_page():
    enqueue("task-a", "noop")
    client = Client()
    for url in (dashboard_url(), timeline_url("task-a"), "/metrics"):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/admin/login/?next="), url


def test_staff_without_work_item_view_permission_gets_403():
    enqueue("task-a", "noop")
    client = Client()
    client.force_login(make_user("intern", "leasing.view_worker"))
    assert client.get(dashboard_url()).status_code == 403
    assert client.get(timeline_url("task-a")).status_code == 403


def test_non_staff_users_cannot_reach_the_admin_pages():
    client = Client()
    client.force_login(make_user("customer", *VIEW_ALL, staff=False))
    response = client.get(dashboard_url())
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
