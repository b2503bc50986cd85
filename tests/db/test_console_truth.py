"""The console and /metrics never show a state healthier than the database and the
processes say: a sweep pass with errors, a sweep that passes but does not keep up,
a process row whose interval is 0, and one moment's figures agreeing across pages."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from leasing import RecoverySweep
from leasing.models import Worker, WorkItem
from leasing.services import processes
from tests.support.admin import claim, dashboard_url, gauges, shift
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db


def strip_sweep(html: str) -> tuple[str, str]:
    """(level, text) of the status strip's sweep entry."""
    strip = html.split('id="leasing-status-strip"')[1].split("</ul>")[0]
    match = re.search(r'data-strip="sweep" data-level="(\w+)">(.*?)</li>', strip, flags=re.S)
    assert match
    return match.group(1), re.sub(r"<[^>]+>", "", match.group(2)).strip()


def tile_level(html: str, label: str) -> str:
    """The level class of the dashboard tile labelled `label`."""
    match = re.search(
        rf'class="leasing-tile leasing-tile-(\w+)"(?:(?!leasing-tile-label).)*?'
        rf'<span class="leasing-tile-label">{re.escape(label)}',
        html,
        flags=re.S,
    )
    assert match, label
    return match.group(1)


def running_sweep(worker_id: str = "sweeper@h:1:aa") -> None:
    """A looping sweep's row after one clean pass, as `recoverysweep` leaves it (every 60 s)."""
    processes.register(worker_id, "sweeper", heartbeat_interval=60)
    processes.record_scan(worker_id, {"errors": 0, "one_off": False}, recovered=0, failed=0)


# --- the sweep: on time is not enough --------------------------------------------------------


def silent_for(html: str) -> int:
    """The seconds a row says its worker has been silent ("silent 5 s")."""
    found = re.search(r"silent (\d+) s", html)
    assert found, html[:500]
    return int(found.group(1))


def test_a_sweep_pass_that_ended_with_errors_is_not_ok(viewer_client, monkeypatch):
    """A step of the pass failed (here the idempotency keys' expiry; marking silent
    processes lost or recovering can fail alike): the pass is on time, yet not OK."""
    sweep = RecoverySweep(worker_id="nightly-sweep", scan_interval_seconds=60)
    assert sweep.scan_and_recover().errors == 0
    html = viewer_client.get(dashboard_url()).content.decode()
    assert strip_sweep(html) == ("ok", "Recovery sweep OK")

    def broken(**kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("leasing.sweep.sweep.delete_expired_keys", broken)
    assert sweep.scan_and_recover().errors == 1
    html = viewer_client.get(dashboard_url()).content.decode()
    assert strip_sweep(html) == ("warn", "Recovery sweep: its last pass had errors")
    assert 'data-sweep="errors"' in html and "ended with 1 error" in html
    assert "Recovery sweep OK" not in html

    monkeypatch.undo()  # the next clean pass: OK again
    sweep.scan_and_recover()
    assert strip_sweep(viewer_client.get(dashboard_url()).content.decode())[0] == "ok"


def test_a_sweep_that_passes_but_leaves_an_expired_lease_is_not_keeping_up(viewer_client):
    running_sweep()
    lease = claim("task-1", "w-dead")  # its holder has no row: at risk, then expired
    shift(lease.work_item_id, lease_expires_at=-150)  # expired before the last pass
    html = viewer_client.get(dashboard_url()).content.decode()
    # Within three intervals (as long as a sweep may be silent) it is not yet a verdict.
    assert strip_sweep(html) == ("ok", "Recovery sweep OK")
    assert tile_level(html, "Expired, awaiting sweep") == "warn"

    shift(lease.work_item_id, lease_expires_at=-200)  # more than three 60 s intervals
    html = viewer_client.get(dashboard_url()).content.decode()
    assert strip_sweep(html) == ("warn", "Recovery sweep not keeping up")
    assert 'data-sweep="behind"' in html
    assert re.search(r"a lease expired 3 min 2\d s ago is still not recovered", html)
    assert tile_level(html, "Expired, awaiting sweep") == "bad"

    # The sweep recovers it: OK again.
    RecoverySweep(worker_id="sweeper@h:1:aa", scan_interval_seconds=60).scan_and_recover()
    assert WorkItem.objects.get(pk=lease.work_item_id).status == "pending"
    processes.set_status("sweeper@h:1:aa", "running")  # the loop's row, not a one-off's
    assert strip_sweep(viewer_client.get(dashboard_url()).content.decode())[0] == "ok"


# --- a process row whose interval is 0: silent as the sweep judges it ------------------------


def test_a_worker_registered_with_a_zero_interval_is_silent_as_the_sweep_judges_it(
    viewer_client, leasing_settings
):
    leasing_settings(METRICS_TOKEN="t0ken", HEARTBEAT_INTERVAL=30)
    processes.register("w-zero", heartbeat_interval=0, work_types=["send_invoice"])
    lease = claim("task-1", "w-zero", work_type="send_invoice")
    Worker.objects.filter(pk="w-zero").update(last_seen_at=database_now() - timedelta(seconds=5))

    # The sweep's own rule (`mark_lost`: 3 x its recorded interval) finds it silent now.
    assert processes.mark_lost(30.0) == ["w-zero"]
    Worker.objects.filter(pk="w-zero").update(status="running")  # before that pass, again

    html = viewer_client.get(dashboard_url()).content.decode()
    row = html.split('data-worker="w-zero"')[1].split("</tr>")[0]
    assert silent_for(row) >= 5
    assert re.search(r'class="leasing-row-bad" data-worker="w-zero" data-at-risk="yes"', html)
    at_risk = viewer_client.get("/admin/leasing/workitem/?lease_health=at_risk")
    assert [i.pk for i in at_risk.context["cl"].result_list] == [lease.work_item_id]
    assert gauges("leases")[(("health", "at_risk"),)] == 1
    assert gauges("leases")[(("health", "healthy"),)] == 0
    assert gauges("processes_silent")[(("role", "worker"),)] == 1
    workers = viewer_client.get("/admin/leasing/worker/").content.decode()
    [row] = [r for r in workers.split("<tr") if "w-zero" in r]
    # A loaded host may take a second between the pages: 5 s then, maybe 6 s now.
    assert "Silent" in row and silent_for(row) >= 5


# --- one moment, every page: a SIGKILLed worker before its leases expire ----------------------


def test_a_killed_workers_live_lease_is_at_risk_on_every_page_until_it_expires(
    viewer_client, leasing_settings
):
    """Between the death (no more beats) and the expiry: the tile, the list's filter, the
    worker page and /metrics each say at risk once the holder is silent, none says healthy;
    the in-flight counts include the lease on every page, expired or not."""
    leasing_settings(METRICS_TOKEN="t0ken", HEARTBEAT_INTERVAL=30)
    processes.register("w-1", heartbeat_interval=30, work_types=["noop"])
    lease = claim("task-1", "w-1")
    # SIGKILL 100 s ago: its row still says running, its heartbeat looked fresh then.
    past = database_now() - timedelta(seconds=100)
    Worker.objects.filter(pk="w-1").update(last_seen_at=past)
    WorkItem.objects.filter(pk=lease.work_item_id).update(heartbeat_at=past)

    def figures() -> dict[str, object]:
        html = viewer_client.get(dashboard_url()).content.decode()
        listed = {
            health: viewer_client.get(f"/admin/leasing/workitem/?lease_health={health}")
            .context["cl"]
            .result_count
            for health in ("healthy", "stale", "at_risk", "expired", "no_progress")
        }
        leases = gauges("leases")
        in_flight = gauges("queue_in_flight")
        return {
            "list": listed,
            "metrics": {dict(k)["health"]: v for k, v in leases.items()},
            "in_flight_metric": in_flight[(("queue", "default"), ("work_type", "noop"))],
            "active_tile": re.search(r"(\d+) healthy · (\d+) stale · (\d+) at risk", html).groups(),
        }

    live = figures()
    assert live["list"] == {"healthy": 0, "stale": 0, "at_risk": 1, "expired": 0, "no_progress": 0}
    assert live["metrics"] == {"healthy": 0, "stale": 0, "at_risk": 1, "expired": 0}
    assert live["active_tile"] == ("0", "0", "1")
    assert live["in_flight_metric"] == 1

    shift(lease.work_item_id, lease_expires_at=-1)  # expired, not yet swept
    gone = figures()
    assert gone["list"] == {"healthy": 0, "stale": 0, "at_risk": 0, "expired": 1, "no_progress": 0}
    assert gone["metrics"] == {"healthy": 0, "stale": 0, "at_risk": 0, "expired": 1}
    assert gone["in_flight_metric"] == 1  # still in progress until the sweep recovers it


def test_metrics_say_what_the_sweep_health_says_beyond_the_last_pass_time(
    leasing_settings, monkeypatch
):
    leasing_settings(METRICS_TOKEN="t0ken")
    sweep = RecoverySweep(worker_id="nightly-sweep", scan_interval_seconds=60)
    sweep.scan_and_recover()
    assert gauges("sweep_last_scan_errors") == {(): 0}
    assert gauges("expired_lease_age_seconds") == {(): 0}

    lease = claim("task-1", "w-dead")
    shift(lease.work_item_id, lease_expires_at=-200)
    assert 199 <= gauges("expired_lease_age_seconds")[()] < 260

    def broken(*args, **kwargs):
        raise RuntimeError("statement timeout")

    monkeypatch.setattr("leasing.sweep.sweep.recover_batch", broken)
    monkeypatch.setattr("leasing.sweep.sweep.expired_ids", broken)
    assert sweep.scan_and_recover().errors == 1
    assert gauges("sweep_last_scan_errors") == {(): 1}
    assert gauges("expired_lease_age_seconds")[()] >= 199  # still waiting


def test_the_worker_page_says_a_silent_workers_leases_are_at_risk_as_the_dashboard_does(
    viewer_client,
):
    processes.register("w-1", heartbeat_interval=30, work_types=["noop"])
    lease = claim("task-1", "w-1")
    page = viewer_client.get("/admin/leasing/worker/w-1/change/").content.decode()
    assert lease.work_item_id in page and 'data-at-risk="yes"' not in page  # alive

    # SIGKILLed 100 s ago: its row still says running, its lease has 200 s left.
    Worker.objects.filter(pk="w-1").update(last_seen_at=database_now() - timedelta(seconds=100))
    page = viewer_client.get("/admin/leasing/worker/w-1/change/").content.decode()
    assert 'data-at-risk="yes"' in page and "nothing renews these leases" in page
    dashboard = viewer_client.get(dashboard_url()).content.decode()
    assert 'data-worker="w-1" data-at-risk="yes"' in dashboard


def test_the_worker_list_says_an_operators_request_before_the_worker_honours_it(viewer_client):
    processes.register("w-1", heartbeat_interval=30, work_types=["noop"])
    assert processes.request("w-1", "stop", by="ops", reason="drain host")
    html = viewer_client.get("/admin/leasing/worker/").content.decode()
    [row] = [r for r in html.split("<tr") if "w-1" in r]
    assert "stop requested" in row  # as the dashboard's row: it claims nothing from now
    dashboard = viewer_client.get(dashboard_url()).content.decode()
    assert "stop requested" in dashboard.split('data-worker="w-1"')[1].split("</tr>")[0]
