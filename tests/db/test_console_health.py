"""The console never looks healthier than it is (issue 42): lease health from the
holder's liveness, the sweep's health, the status strip, the workers panel at scale,
and which workers serve a queue (quiet, stopping and over-bound ones claim nothing)."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.template.defaultfilters import date
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from leasing import RecoverySweep, enqueue
from leasing.models import Worker
from leasing.services import processes
from leasing.sql.processes import RunReport
from leasing.sweep.schedule import run_sweep_pass
from tests.support.admin import claim, dashboard_url, lease_scenario, register_holders, shift
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db


def tile(html: str, label: str) -> str:
    """The text of the dashboard tile labelled `label`."""
    match = re.search(
        rf'<span class="leasing-tile-label">{re.escape(label)}.*?</a>', html, flags=re.S
    )
    assert match, label
    return re.sub(r"<[^>]+>", " ", match.group(0))


def test_a_lost_workers_leases_are_at_risk_first_and_red_until_recovered(viewer_client):
    scenario = lease_scenario()
    register_holders()
    register_holders("worker-1", status="lost")  # holds the healthy and the stuck lease
    html = viewer_client.get(dashboard_url()).content.decode()
    assert "2 at risk" in tile(html, "Active leases")
    assert "0 healthy" in tile(html, "Active leases")  # never counted healthy
    assert re.search(r"\b2\b", tile(html, "At-risk leases"))
    assert "(problem)" in tile(html, "At-risk leases")
    rows = re.findall(r'<tr class="([^"]*)" data-worker="([^"]+)" data-at-risk="(\w+)"', html)
    assert rows[0] == ("leasing-row-bad", "worker-1", "yes")  # first, red
    first = html.split('data-worker="worker-1"')[1].split("</tr>")[0]
    assert scenario.healthy.work_item_id in first
    assert re.search(r"expires in \d+ min( \d+ s)?; no recovery sweep is running", first)

    # With a sweep passing, the lease says what follows its expiry.
    Worker.objects.create(worker_id="sweeper@h", role="sweeper", hostname="h", pid=2,
                          heartbeat_interval=60, last_scan_at=database_now())  # fmt: skip
    html = viewer_client.get(dashboard_url()).content.decode()
    first = html.split('data-worker="worker-1"')[1].split("</tr>")[0]
    assert re.search(r"expires in [^<]+, then the sweep re-queues it", first)

    # Recovered (no lease left): the lost row leaves the panel.
    for item in (scenario.healthy, scenario.stuck):
        shift(item.work_item_id, lease_expires_at=-1)
    from leasing.models import WorkItem

    WorkItem.objects.filter(lease_holder="worker-1").update(
        status="pending", lease_holder=None, lease_expires_at=None, lease_acquired_at=None,
        heartbeat_at=None, lease_deadline_at=None,
    )  # fmt: skip
    html = viewer_client.get(dashboard_url()).content.decode()
    assert 'data-worker="worker-1"' not in html


def test_a_silent_worker_turns_its_leases_at_risk_before_the_sweep_marks_it_lost(viewer_client):
    lease_scenario()
    register_holders()
    Worker.objects.filter(pk="worker-1").update(last_seen_at=database_now() - timedelta(seconds=95))
    html = viewer_client.get(dashboard_url()).content.decode()
    assert "2 at risk" in tile(html, "Active leases")
    assert re.search(r'<tr class="leasing-row-bad" data-worker="worker-1" data-at-risk="yes"', html)


def test_at_risk_filter_on_the_list_matches_the_tile(viewer_client):
    scenario = lease_scenario()
    register_holders("worker-2", "worker-3")
    response = viewer_client.get("/admin/leasing/workitem/?lease_health=at_risk")
    assert response.context["cl"].result_count == 2
    html = response.content.decode()
    assert scenario.healthy.work_item_id in html and scenario.stale.work_item_id not in html


def test_sweep_late_is_not_ok_on_the_dashboard(viewer_client):
    Worker.objects.create(worker_id="sweeper@h", role="sweeper", hostname="h", pid=2,
                          heartbeat_interval=60,
                          last_scan_at=database_now() - timedelta(seconds=100))  # fmt: skip
    html = viewer_client.get(dashboard_url()).content.decode()
    assert 'data-sweep="late"' in html and "Recovery sweep OK" not in html
    Worker.objects.filter(pk="sweeper@h").update(last_scan_at=database_now())
    html = viewer_client.get(dashboard_url()).content.decode()
    assert 'data-sweep="ok"' in html and "Recovery sweep OK" in html


def test_forty_workers_fold_healthy_ones_past_ten_problems_first(viewer_client):
    now = database_now()
    for i in range(40):
        Worker.objects.create(worker_id=f"w-{i:02}", hostname="h", pid=i, heartbeat_interval=30,
                              last_seen_at=now)  # fmt: skip
    Worker.objects.filter(pk="w-33").update(last_seen_at=now - timedelta(seconds=200))
    claim("task-x", "w-39")
    Worker.objects.filter(pk="w-39").update(status="lost")
    html = viewer_client.get(dashboard_url()).content.decode()
    table = html.split('id="leasing-workers-table"')[1].split("</table>")[0]
    listed = re.findall(r'data-worker="([^"]+)"', table)
    assert listed[:2] == ["w-39", "w-33"]  # at risk, then silent
    assert len(listed) == 12  # the two problems and ten healthy workers
    folded = html.split('id="leasing-workers-folded"')[1].split("</details>")[0]
    assert "28 more healthy workers" in folded
    assert len(re.findall(r'data-worker="', folded)) == 28


def strip_entries(html: str) -> dict[str, tuple[str, str]]:
    """`{key: (level, text)}` of the status strip."""
    strip = html.split('id="leasing-status-strip"')[1].split("</ul>")[0]
    return {
        key: (level, re.sub(r"<[^>]+>", "", text).strip())
        for key, level, text in re.findall(
            r'data-strip="([^"]+)" data-level="(\w+)">(.*?)</li>', strip, flags=re.S
        )
    }


def test_a_paused_queue_shows_in_the_strip_and_its_items_are_not_claimable(viewer_client):
    from leasing import enqueue, pause

    for i in range(3):
        enqueue(f"b{i}", "send_invoice", queue_name="billing")
    enqueue("m0", "resize_image", queue_name="media")
    html = viewer_client.get(dashboard_url()).content.decode()
    assert strip_entries(html)["pauses"] == ("ok", "Nothing paused")
    assert "4 claimable" in tile(html, "Pending backlog")

    pause(queue="billing", by="ops", reason="billing provider down")
    html = viewer_client.get(dashboard_url()).content.decode()
    entries = strip_entries(html)
    assert entries["pause-queue-billing"] == ("warn", "Queue billing paused: 3 items held")
    assert "pauses" not in entries
    backlog = tile(html, "Pending backlog")
    assert "1 claimable" in backlog and "3 held by a pause" in backlog
    row = html.split('data-queue="billing"')[1].split("</tr>")[0]
    assert 'data-held-by-pause="3"' in row and "claimable" not in row
    # The strip's other facts, at their true level.
    assert entries["sweep"][0] == "bad" and entries["unserved"][0] == "bad"
    assert entries["at-risk"] == ("ok", "No lease at risk")


def test_paused_items_do_not_age_the_oldest_pending_warning(viewer_client):
    from leasing import enqueue, pause
    from leasing.models import WorkItem

    old = enqueue("old", "send_invoice", queue_name="billing")
    WorkItem.objects.filter(pk=old.pk).update(created_at=database_now() - timedelta(hours=3))
    html = viewer_client.get(dashboard_url()).content.decode()
    assert "(attention)" in tile(html, "Oldest pending")
    pause(queue="billing", by="ops", reason="hold")
    html = viewer_client.get(dashboard_url()).content.decode()
    assert "(attention)" not in tile(html, "Oldest pending")
    assert "nothing is waiting" in tile(html, "Oldest pending")


def test_the_strip_says_when_leases_are_at_risk_and_the_sweep_is_late(viewer_client):
    lease_scenario()
    register_holders("worker-2", "worker-3")
    Worker.objects.create(worker_id="sweeper@h", role="sweeper", hostname="h", pid=2,
                          heartbeat_interval=60,
                          last_scan_at=database_now() - timedelta(seconds=100))  # fmt: skip
    entries = strip_entries(viewer_client.get(dashboard_url()).content.decode())
    assert entries["at-risk"] == ("bad", "2 leases at risk")
    assert entries["sweep"] == ("warn", "Recovery sweep late")


def test_the_strip_shows_the_replicas_lag_only_when_a_replica_is_read():
    from dataclasses import replace

    from leasing.console import build_dashboard
    from leasing.console.replica import ReplicaLag
    from leasing.console.strip import status_strip

    data = build_dashboard()
    keys = [e.key for e in status_strip(data, "/list/", "/pauses/")]
    assert "replica" not in keys
    lagging = replace(data, replica=ReplicaLag("replica", True, True, 95.0, 4096, False))
    [entry] = [e for e in status_strip(lagging, "/list/", "/pauses/") if e.key == "replica"]
    assert entry.level == "bad" and entry.text.startswith("Replica replica lag 1 min 35 s")
    fresh = replace(data, replica=ReplicaLag("replica", True, True, 0.5, 0, False))
    [entry] = [e for e in status_strip(fresh, "/list/", "/pauses/") if e.key == "replica"]
    assert entry.level == "ok"


def test_the_lists_heartbeat_column_uses_the_same_per_type_threshold(viewer_client):
    from leasing.handlers import registry

    scenario = lease_scenario()
    register_holders()
    shift(scenario.healthy.work_item_id, heartbeat_at=-20)
    registry.register("send_invoice", lambda ctx: None, heartbeat_interval=5, lease_duration=45)
    try:
        html = viewer_client.get("/admin/leasing/workitem/?lease_health=stale").content.decode()
    finally:
        registry.unregister("send_invoice")
    assert scenario.healthy.work_item_id in html  # 20 s without a beat: stale for a 5 s type
    assert re.search(r'title="No heartbeat for more than 15 s">2\d s ago \(stale\)', html)


# --- who serves a queue: quiet, stopping and over-bound workers claim nothing -------------------


def queue_cell(html: str, work_type: str) -> str:
    """The live-workers cell of the queue table's row of `work_type`."""
    row = html.split(f'data-work-type="{work_type}"')[1].split("</tr>")[0]
    return re.sub(r"<[^>]+>", " ", re.findall(r"<td>(.*?)</td>", row, flags=re.S)[-1])


def unserved_gauge(queue: str, work_type: str) -> float:
    """`leasing_queue_unserved` of the pair, as /metrics says it."""
    body = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken").content.decode()
    [value] = [
        s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "leasing_queue_unserved"
        and s.labels == {"queue": queue, "work_type": work_type}
    ]
    return value


def unserved_figures(viewer_client) -> tuple[tuple[str, str], str, str, float]:
    """The strip's entry, the tile's value, the row's cell and the gauge of billing/send_invoice."""
    html = viewer_client.get(dashboard_url()).content.decode()
    tile_html = html.split('<span class="leasing-tile-label">Unserved work')[1]
    value = re.search(r'leasing-tile-value">(\d+)<', tile_html).group(1)
    cell = queue_cell(html, "send_invoice")
    return strip_entries(html)["unserved"], value, cell, unserved_gauge("billing", "send_invoice")


def enqueue_invoice() -> None:
    enqueue("invoice-1", "send_invoice", queue_name="billing")


SERVED = ("ok", "Every pending work type is served")
UNSERVED = ("bad", "Unserved work: 1 queue and work type pair")


def test_a_worker_asked_to_be_quiet_serves_nothing_though_it_still_beats(
    viewer_client, leasing_settings
):
    leasing_settings(METRICS_TOKEN="t0ken")
    enqueue_invoice()
    processes.register("w-1", heartbeat_interval=30, work_types=["send_invoice"])
    strip, value, cell, gauge = unserved_figures(viewer_client)
    assert (strip, value, gauge) == (SERVED, "0", 0) and "w-1" in cell

    # The documented API (the console's Quiet action calls it): it stops claiming at its
    # next beat, and a request is never taken back, so it counts from now.
    assert processes.request("w-1", "quiet", by="ops", reason="drain host")
    strip, value, cell, gauge = unserved_figures(viewer_client)
    assert (strip, value, gauge) == (UNSERVED, "1", 1)
    assert "none: no live worker serves it" in cell and "w-1 (quiet): claims nothing" in cell
    processes.beat("w-1", runs=RunReport(quiet=True))  # honoured: its row says quiet
    assert unserved_figures(viewer_client)[:2] == (UNSERVED, "1")

    # Another worker that claims serves the pair; the quiet one is still listed, as quiet.
    processes.register("w-2", heartbeat_interval=30, work_types=["send_invoice"])
    strip, value, cell, gauge = unserved_figures(viewer_client)
    assert (strip, value, gauge) == (SERVED, "0", 0)
    assert cell.split()[:2] == ["1", "w-2"] and "w-1 (quiet): claims nothing" in cell


def test_a_stopping_worker_serves_nothing(viewer_client, leasing_settings):
    leasing_settings(METRICS_TOKEN="t0ken")
    enqueue_invoice()
    processes.register("w-1", heartbeat_interval=30, work_types=["send_invoice"])
    processes.set_status("w-1", "stopping")  # what its SIGTERM does: it finishes, claims nothing
    strip, value, cell, gauge = unserved_figures(viewer_client)
    assert (strip, value, gauge) == (UNSERVED, "1", 1)
    assert "w-1 (stopping): claims nothing" in cell


def test_a_worker_past_its_abandoned_run_bound_serves_nothing(viewer_client, leasing_settings):
    leasing_settings(METRICS_TOKEN="t0ken", MAX_ABANDONED_RUNS=4)
    enqueue_invoice()
    processes.register("w-1", heartbeat_interval=30, work_types=["send_invoice"])
    # Abandoned runs under the bound: the worker still claims.
    processes.beat("w-1", runs=RunReport(abandoned=2, newly_abandoned=2))
    assert unserved_figures(viewer_client)[0] == SERVED
    # Over it, the worker's beat says it claims nothing until it restarts.
    processes.beat("w-1", runs=RunReport(abandoned=5, newly_abandoned=3, quiet=True))
    strip, value, cell, gauge = unserved_figures(viewer_client)
    assert (strip, value, gauge) == (UNSERVED, "1", 1)
    assert "w-1 (5 abandoned runs, over MAX_ABANDONED_RUNS): claims nothing" in cell


# --- the sweep: a stopped process is not running; cron and django-q2 passes go by time ----------


def sweep_process(worker_id: str) -> None:
    """A looping sweep's row after one pass, as `recoverysweep` leaves it (every 60 s)."""
    processes.register(worker_id, "sweeper", heartbeat_interval=60)
    processes.record_scan(worker_id, {"errors": 0}, recovered=0, failed=0)


def test_a_sweep_whose_processes_all_stopped_is_not_running_however_recent_its_pass(
    viewer_client,
):
    sweep_process("sweeper@h:1:aa")
    html = viewer_client.get(dashboard_url()).content.decode()
    assert strip_entries(html)["sweep"] == ("ok", "Recovery sweep OK")

    processes.set_status("sweeper@h:1:aa", "stopped")  # SIGTERM: it exits cleanly
    html = viewer_client.get(dashboard_url()).content.decode()
    stopped_at = Worker.objects.get(pk="sweeper@h:1:aa").stopped_at
    at = date(stopped_at, "Y-m-d H:i:s")
    assert strip_entries(html)["sweep"] == ("bad", f"Recovery sweep not running (stopped at {at})")
    assert 'data-sweep="dead"' in html and "No recovery sweep is running" in html

    # Another one, lost later: the strip names the last to go.
    sweep_process("sweeper@h:2:bb")
    Worker.objects.filter(pk="sweeper@h:2:bb").update(status="lost")
    html = viewer_client.get(dashboard_url()).content.decode()
    lost = date(Worker.objects.get(pk="sweeper@h:2:bb").last_seen_at, "Y-m-d H:i:s")
    assert strip_entries(html)["sweep"] == ("bad", f"Recovery sweep not running (lost at {lost})")


@pytest.mark.parametrize("form", ["cron", "django-q", "own scheduler"])
def test_passes_of_cron_and_django_q_stay_judged_by_time_though_their_row_is_stopped(
    viewer_client, leasing_settings, form
):
    leasing_settings(SWEEP_INTERVAL=60)
    sweep_process("sweeper@h:1:aa")
    Worker.objects.filter(pk="sweeper@h:1:aa").update(status="stopped")
    html = viewer_client.get(dashboard_url()).content.decode()
    assert strip_entries(html)["sweep"][0] == "bad"  # a stopped process makes no more passes

    if form == "cron":
        call_command("recoverysweep", "--once", stdout=StringIO(), stderr=StringIO())
    elif form == "django-q":
        run_sweep_pass(interval=60.0)
    else:  # a one-off pass under an id of the caller's choosing
        RecoverySweep(worker_id="nightly-sweep", scan_interval_seconds=60).scan_and_recover()
    [passes] = Worker.objects.sweepers().exclude(pk="sweeper@h:1:aa")
    assert passes.status == "stopped"  # between passes, by design
    html = viewer_client.get(dashboard_url()).content.decode()
    assert strip_entries(html)["sweep"] == ("ok", "Recovery sweep OK")
    for seconds, entry in (
        (100, ("warn", "Recovery sweep late")),
        (200, ("bad", "Recovery sweep not running")),
    ):
        Worker.objects.filter(pk=passes.pk).update(
            last_scan_at=database_now() - timedelta(seconds=seconds)
        )
        html = viewer_client.get(dashboard_url()).content.decode()
        assert strip_entries(html)["sweep"] == entry
    assert re.search(r"No recovery sweep for 3 min 2\d s", html)  # by its time, not its status


# --- the sweep: stopped rows of history never hide a sweep that runs ---------------------------


def sweeps_of_the_past(count: int, *, newest: float) -> None:
    """`count` sweep processes that passed every 60 s and stopped, the last `newest` s ago."""
    now = database_now()
    for n in range(count):
        at = now - timedelta(seconds=newest + n)
        Worker.objects.create(worker_id=f"sweeper@old:{n}", role="sweeper", hostname="old", pid=n,
                              heartbeat_interval=60, status="stopped", scans=3,
                              last_scan_at=at, last_seen_at=at, stopped_at=at)  # fmt: skip


def sweep_running_gauge() -> float:
    """`leasing_sweep_running`, as /metrics says it."""
    body = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken").content.decode()
    [value] = [
        s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "leasing_sweep_running"
    ]
    return value


def test_a_sweep_that_just_started_runs_however_many_stopped_ones_passed_before(
    viewer_client, leasing_settings
):
    leasing_settings(METRICS_TOKEN="t0ken")
    sweeps_of_the_past(25, newest=10)
    processes.register("sweeper@h:9:new", "sweeper", heartbeat_interval=60)  # no pass yet
    html = viewer_client.get(dashboard_url()).content.decode()
    assert "No recovery sweep is running" not in html
    assert "The running recovery sweep has recorded no pass yet" in html
    assert strip_entries(html)["sweep"] == ("bad", "Recovery sweep not running")  # none ended
    assert 'data-worker="sweeper@h:9:new"' in html
    assert sweep_running_gauge() == 1


def test_a_running_sweep_is_judged_by_its_pass_though_stopped_ones_passed_since(
    viewer_client, leasing_settings
):
    leasing_settings(METRICS_TOKEN="t0ken")
    sweeps_of_the_past(25, newest=5)  # passes 5 to 29 s ago
    sweep_process("sweeper@h:9:on")
    Worker.objects.filter(pk="sweeper@h:9:on").update(
        last_scan_at=database_now() - timedelta(seconds=40)
    )
    html = viewer_client.get(dashboard_url()).content.decode()
    assert "No recovery sweep is running" not in html
    assert 'data-sweep="ok"' in html
    assert strip_entries(html)["sweep"] == ("ok", "Recovery sweep OK")
    assert sweep_running_gauge() == 1


def test_one_off_passes_are_judged_by_time_though_stopped_sweeps_passed_since(
    viewer_client, leasing_settings
):
    leasing_settings(METRICS_TOKEN="t0ken", SWEEP_INTERVAL=60)
    sweeps_of_the_past(25, newest=5)
    RecoverySweep(worker_id="nightly-sweep", scan_interval_seconds=60).scan_and_recover()
    Worker.objects.filter(pk="nightly-sweep").update(
        last_scan_at=database_now() - timedelta(seconds=40)
    )
    html = viewer_client.get(dashboard_url()).content.decode()
    assert "No recovery sweep is running" not in html
    assert strip_entries(html)["sweep"] == ("ok", "Recovery sweep OK")
    assert sweep_running_gauge() == 0  # one-off passes: no process
