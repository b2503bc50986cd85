"""Liveness from `last_seen_at` against each process's own interval, everywhere it shows."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from leasing.console import processes
from leasing.console.leases import lease_health, live_holders
from leasing.console.liveness import beat_interval
from leasing.console.processes import LEASE_IDS_SHOWN, live_holder_ids, live_workers, sweep_health
from leasing.models import Worker
from tests.support.admin import VIEW_ALL, claim, dashboard_url, make_user
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_cached_figures():
    cache.clear()


@pytest.fixture
def viewer() -> Client:
    client = Client()
    client.force_login(make_user("viewer", *VIEW_ALL))
    return client


def process(worker_id: str, *, seen: float, role: str = "worker", **fields) -> Worker:
    """A process row last seen `seen` seconds ago (database clock)."""
    now = database_now()
    Worker.objects.create(worker_id=worker_id, role=role, hostname="h", pid=1, **fields)
    Worker.objects.filter(pk=worker_id).update(last_seen_at=now - timedelta(seconds=seen))
    return Worker.objects.get(pk=worker_id)


def test_the_interval_is_the_process_own(leasing_settings):
    leasing_settings(HEARTBEAT_INTERVAL=10, SWEEP_INTERVAL=60)
    assert beat_interval(process("w", seen=0, heartbeat_interval=0.5)) == 0.5
    assert beat_interval(process("s", seen=0, role="sweeper", heartbeat_interval=5)) == 5
    # Rows registered before processes recorded their interval: the setting of their role.
    assert beat_interval(process("old-w", seen=0)) == 10
    assert beat_interval(process("old-s", seen=0, role="sweeper")) == 60


def test_a_worker_silent_for_three_intervals_is_red_and_listed_first(leasing_settings, viewer):
    leasing_settings(HEARTBEAT_INTERVAL=30)
    process("w-ok", seen=89)
    process("w-dead", seen=151)
    process("w-fast", seen=4, heartbeat_interval=1)  # 3 s is silent for a 1 s beat
    lease = claim("task-of-dead", "w-dead")
    workers, _ = live_workers()
    assert [w.worker_id for w in workers] == ["w-dead", "w-fast", "w-ok"]  # problems first
    dead, fast, ok = workers
    assert fast.liveness.silent and fast.liveness.limit_seconds == 3
    assert dead.liveness.silent and dead.liveness.text == "silent 2 min 31 s"
    assert not ok.liveness.silent and ok.liveness.text == "seen 1 min 29 s ago"

    html = viewer.get(dashboard_url()).content.decode()
    row = re.search(r'<tr class="leasing-row-bad" data-worker="w-dead"[^>]*>(.*?)</tr>', html, re.S)
    assert row and "silent 2 min 31 s" in row.group(1) and lease.work_item_id in row.group(1)
    assert '<tr class="" data-worker="w-ok" data-at-risk="no">' in html


def test_the_page_judges_leases_by_the_live_workers_it_listed_unless_it_listed_its_fill(
    leasing_settings, monkeypatch
):
    leasing_settings(HEARTBEAT_INTERVAL=30)
    process("w-ok", seen=5)
    process("w-stopping", seen=5, status="stopping")
    process("w-silent", seen=200)
    process("w-lost", seen=5, status="lost")
    process("s-1", seen=5, role="sweeper")
    for holder in ("w-ok", "w-silent", "w-lost", "s-1", "w-unknown"):
        claim(f"task-{holder}", holder)
    workers, _ = live_workers()
    listed = live_holder_ids(workers)
    assert listed is not None and sorted(listed) == sorted(live_holders())
    assert sorted(listed) == ["w-ok", "w-stopping"]
    assert lease_health(holders=listed) == lease_health()
    assert (lease_health(holders=listed).at_risk, lease_health().healthy) == (4, 1)
    # As many running or stopping workers as it reads: others may be alive, unread.
    monkeypatch.setattr(processes, "WORKERS_LISTED", 2)
    assert live_holder_ids(live_workers()[0]) is None


def test_a_worker_row_links_its_page_its_first_leases_and_all_of_them(leasing_settings, viewer):
    leasing_settings(HEARTBEAT_INTERVAL=30)
    process("w/1", seen=5, heartbeat_interval=30)
    leases = [claim(f"task-{n}", "w/1") for n in range(LEASE_IDS_SHOWN + 2)]
    html = viewer.get(dashboard_url()).content.decode()
    row = re.search(r'<tr class="" data-worker="w/1"[^>]*>(.*?)</tr>', html, re.S)
    assert row, "the worker's row is missing"
    cells = row.group(1)
    assert f'href="{reverse("admin:leasing_worker_change", args=["w_2F1"])}"' in cells
    assert "seen 5 s ago" in cells and "beats every 30 s; silent after 1 min 30 s" in cells
    links = re.findall(r'<a href="([^"]*)">([^<]*)</a>', cells.split("leasing-lease-ids")[1])
    shown = [text for _, text in links[:-1]]
    assert len(shown) == LEASE_IDS_SHOWN and set(shown) <= {x.work_item_id for x in leases}
    assert links[0][0] == reverse("admin:leasing_workitem_change", args=[shown[0]])
    everything = reverse("admin:leasing_workitem_changelist") + "?q=w%2F1"
    assert links[-1] == (everything, f"all {len(leases)}…")


def test_sweeper_rows_agree_with_the_banner_which_states_the_real_interval(
    leasing_settings, viewer
):
    leasing_settings(SWEEP_INTERVAL=60)
    now = database_now()
    # The demo's sweeper: passes every 5 s, though the setting says 60 s.
    process("sweeper@h", seen=4, role="sweeper", heartbeat_interval=5, scans=25,
            last_scan_at=now - timedelta(seconds=4))  # fmt: skip
    health = sweep_health()
    assert health.ok and health.interval_seconds == pytest.approx(5.0)
    assert "it runs every 5 s" in health.message

    # Killed: 16 s without a pass is more than three of its 5 s intervals.
    Worker.objects.filter(pk="sweeper@h").update(
        last_seen_at=now - timedelta(seconds=16), last_scan_at=now - timedelta(seconds=16)
    )
    html = viewer.get(dashboard_url()).content.decode()
    assert "Warning: recovery sweep not running." in html
    assert "more than 3 of its 5 s intervals" in html
    row = re.search(r'<tr class="leasing-row-bad" data-worker="sweeper@h">(.*?)</tr>', html, re.S)
    assert row and "silent 1" in row.group(1)  # "silent 16 s" give or take the clock
    assert "leasing-worker-running" not in row.group(1)


def test_worker_admin_shows_liveness_and_the_items_a_worker_holds(leasing_settings):
    leasing_settings(HEARTBEAT_INTERVAL=30)
    process("w-dead", seen=200)
    process("w-ok", seen=2)
    held = [claim(f"t{n}", "w-ok").work_item_id for n in range(2)]
    client = Client()
    client.force_login(make_user("root", superuser=True))
    listing = client.get("/admin/leasing/worker/").content.decode()
    assert re.search(r'leasing-worker-lost">Silent</span>', listing)
    assert "silent 3 min 20 s" in listing and "seen 2 s ago" in listing

    page = client.get("/admin/leasing/worker/w-ok/change/").content.decode()
    labels = re.findall(r"<label>([^<]+):</label>", page)
    assert labels.count("Status") == 1 and labels.count("Last seen") == 1
    for item_id in held:
        assert f'href="/admin/leasing/workitem/{item_id}/change/"' in page
