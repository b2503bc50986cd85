"""More of the console never reading healthier than the database: an at-risk lease's row
says what the sweep's health says (not running, late, its last pass failed, not keeping
up), the sweep judges a sweeper row with no recorded interval by its role's default as
the console does, and /metrics counts the items blocked by dependencies."""

from __future__ import annotations

import html as html_lib
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse

from leasing import RecoverySweep, enqueue
from leasing.models import Worker
from leasing.services import processes
from tests.support.admin import claim, dashboard_url, gauges, shift
from tests.support.helpers import database_now
from tests.support.items import run_item

pytestmark = pytest.mark.django_db


# --- an at-risk lease says what the sweep's health says ----------------------------------------


def lost_worker_with_a_lease() -> str:
    """A worker that was marked lost while holding a lease (5 min left): at risk."""
    processes.register("w-1", heartbeat_interval=30, work_types=["noop"])
    lease = claim("task-1", "w-1")
    Worker.objects.filter(pk="w-1").update(status="lost")
    return lease.work_item_id


def sweeper(worker_id: str = "sweeper@h:1:aa", *, errors: int = 0, ago: float = 0) -> None:
    """A looping sweep's row (every 60 s) after one pass `ago` seconds ago."""
    processes.register(worker_id, "sweeper", heartbeat_interval=60)
    processes.record_scan(worker_id, {"errors": errors, "one_off": False}, recovered=0, failed=0)
    if ago:
        past = database_now() - timedelta(seconds=ago)
        Worker.objects.filter(pk=worker_id).update(last_scan_at=past, last_seen_at=past)


def at_risk_row(client: Client) -> tuple[str, list[str], str]:
    """(sweep state, the fates the lost worker's row gives its leases, the panel's headline)."""
    page = client.get(dashboard_url()).content.decode()
    state = re.search(r'id="leasing-sweep-status" data-sweep="(\w+)"', page)
    assert state, page[:500]
    row = page.split('data-worker="w-1" data-at-risk="yes"')[1].split("</tr>")[0]
    fates = re.findall(r'<span class="leasing-sub leasing-bad-text">([^<]*)</span></span>', row)
    headline = page.split('id="leasing-workers-at-risk">')[1].split("</p>")[0]
    unescape = html_lib.unescape
    return state.group(1), [unescape(f) for f in fates], unescape(re.sub(r"<[^>]+>", "", headline))


def test_an_at_risk_lease_says_no_sweep_runs_only_when_none_does(viewer_client):
    lost_worker_with_a_lease()
    sweeper()
    processes.set_status("sweeper@h:1:aa", "stopped")  # its process exited: nothing sweeps
    state, fates, headline = at_risk_row(viewer_client)
    assert state == "dead"
    assert len(fates) == 1
    assert re.fullmatch(
        r"expires in \d+ min( \d+ s)?; no recovery sweep is running to re-queue it", fates[0]
    )
    assert headline.endswith("each expires; no recovery sweep is running to re-queue it.")
    # The at-risk tile and the worker's own page say the same, never "then the sweep".
    page = html_lib.unescape(viewer_client.get(dashboard_url()).content.decode())
    assert "each expires; no recovery sweep is running to re-queue it" in page
    assert "then the sweep" not in page
    worker_page = viewer_client.get(reverse("admin:leasing_worker_change", args=["w-1"]))
    assert worker_page.status_code == 200
    text = html_lib.unescape(worker_page.content.decode())
    assert "each expires; no recovery sweep is running to re-queue it." in text
    assert "then the sweep" not in text


def test_an_at_risk_lease_under_a_sweep_whose_last_pass_erred_says_so(viewer_client):
    lost_worker_with_a_lease()
    sweeper(errors=2)  # running, on time, but a step of its pass failed
    state, fates, headline = at_risk_row(viewer_client)
    assert state == "errors"
    assert re.fullmatch(
        r"expires in \d+ min( \d+ s)?; the sweep's last pass failed; "
        r"it may not re-queue it in time",
        fates[0],
    )
    assert "no recovery sweep is running" not in fates[0] + headline
    assert "then the sweep" not in fates[0] + headline
    assert headline.endswith("the sweep's last pass failed; it may not re-queue it in time.")


def test_an_at_risk_lease_under_a_late_sweep_says_it_is_late(viewer_client):
    lost_worker_with_a_lease()
    sweeper(ago=100)  # more than 1.5 of its 60 s intervals, less than three: late, not dead
    state, fates, _ = at_risk_row(viewer_client)
    assert state == "late"
    assert re.fullmatch(
        r"expires in \d+ min( \d+ s)?; the sweep is late; it may not re-queue it in time", fates[0]
    )

    # Its next pass, on time: the lease's fate is the sweep's again.
    processes.record_scan("sweeper@h:1:aa", {"errors": 0, "one_off": False}, recovered=0, failed=0)
    state, fates, headline = at_risk_row(viewer_client)
    assert state == "ok"
    assert re.fullmatch(r"expires in \d+ min( \d+ s)?, then the sweep re-queues it", fates[0])
    assert headline.endswith("each expires, then the sweep recovers it.")


def test_an_expired_lease_under_a_sweep_that_does_not_keep_up_says_so(viewer_client):
    item_id = lost_worker_with_a_lease()
    sweeper()
    shift(item_id, lease_expires_at=-200)  # more than three 60 s intervals, not recovered
    state, fates, _ = at_risk_row(viewer_client)
    assert state == "behind"
    assert re.fullmatch(
        r"expired 3 min 2\d s ago; the sweep is not keeping up; it may not re-queue it in time",
        fates[0],
    )


# --- a sweeper row with no recorded interval: judged by the sweep interval ---------------------


def sweeper_row_of_old(seen_ago: float) -> None:
    """A running sweeper's row from before `heartbeat_interval` was recorded."""
    processes.register("sweeper@old", "sweeper", heartbeat_interval=60)
    Worker.objects.filter(pk="sweeper@old").update(
        heartbeat_interval=None, last_seen_at=database_now() - timedelta(seconds=seen_ago)
    )


def test_a_sweeper_with_no_recorded_interval_is_judged_by_the_sweep_interval(
    viewer_client, leasing_settings
):
    leasing_settings(METRICS_TOKEN="t0ken", HEARTBEAT_INTERVAL=30, SWEEP_INTERVAL=60)
    # Seen 120 s ago: past three heartbeat intervals (90 s), within three sweep ones (180 s).
    sweeper_row_of_old(120)
    processes.register("w-old", heartbeat_interval=30, work_types=["noop"])
    Worker.objects.filter(pk="w-old").update(
        heartbeat_interval=None, last_seen_at=database_now() - timedelta(seconds=120)
    )
    sweep = RecoverySweep(worker_id="nightly-sweep", scan_interval_seconds=60)
    assert sweep.scan_and_recover().errors == 0
    # A worker is judged by the heartbeat interval, a sweeper by the sweep interval.
    assert Worker.objects.get(pk="w-old").status == "lost"
    assert Worker.objects.get(pk="sweeper@old").status == "running"
    page = viewer_client.get(dashboard_url()).content.decode()
    assert '<tr class="" data-worker="sweeper@old">' in page  # not red: not silent
    row = page.split('data-worker="sweeper@old"')[1].split("</tr>")[0]
    assert "seen 2 min" in row and "silent 2 min" not in row
    assert "beats every 1 min; silent after 3 min" in row
    assert gauges("processes_silent")[(("role", "sweeper"),)] == 0
    assert gauges("sweep_running") == {(): 1}

    # Seen 200 s ago: past three sweep intervals; the sweep marks it lost.
    Worker.objects.filter(pk="sweeper@old").update(
        last_seen_at=database_now() - timedelta(seconds=200)
    )
    assert sweep.scan_and_recover().errors == 0
    assert Worker.objects.get(pk="sweeper@old").status == "lost"


# --- /metrics: items blocked by dependencies ---------------------------------------------------


def test_metrics_count_the_items_blocked_by_dependencies_per_queue(leasing_settings):
    leasing_settings(METRICS_TOKEN="t0ken")
    parent = enqueue("parent", "noop", queue_name="billing")
    enqueue("child", "noop", queue_name="billing", depends_on=[parent.work_item_id])
    enqueue("other", "noop")  # default queue, nothing blocked
    assert gauges("items_blocked") == {(("queue", "billing"),): 1, (("queue", "default"),): 0}
    assert gauges("queue_pending")[(("queue", "billing"), ("work_type", "noop"))] == 2

    run_item(parent)  # completes: the child is claimable
    assert gauges("items_blocked") == {(("queue", "billing"),): 0, (("queue", "default"),): 0}
