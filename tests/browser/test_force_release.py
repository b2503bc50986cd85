"""The dashboard in a real browser: Debian's Chromium driven by Playwright.

Playwright never downloads a browser here (the Makefile exports
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1; scripts/ensure-chromium.sh installs
Debian's `chromium`). The flow: log in, open the dashboard from the admin
index, see the charts, filter the work items by lease health, force-release
a stale lease through the confirmation page, and find the item pending with
its `state_transition` checkpoint in the timeline. A screenshot of the
dashboard is saved to artifacts/dashboard.png.
"""

from __future__ import annotations

import pytest
from django.core.cache import cache

from leasing.models import Checkpoint, Worker, WorkItem
from tests.support.admin import FORCE, VIEW_ALL, lease_scenario, make_user, register_holders
from tests.support.browser import ARTIFACTS, PASSWORD
from tests.support.helpers import database_now

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_operator_force_releases_a_stale_lease_from_the_dashboard(live_server, page):
    cache.clear()  # no retry distribution cached by another test
    scenario = lease_scenario()
    stale_id = scenario.stale.work_item_id
    make_user("operator", *VIEW_ALL, FORCE)
    Worker.objects.create(worker_id="worker-1", hostname="host-1", pid=11, concurrency=2)
    register_holders(
        "worker-2", "worker-3"
    )  # the stale lease's holder is alive: stale, not at risk
    Worker.objects.create(
        worker_id="sweeper@host-1",
        role="sweeper",
        hostname="host-1",
        pid=12,
        last_scan_at=database_now(),
        scans=1,
    )

    # Log in and reach the dashboard from the admin index.
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.get_by_role("link", name="Open the leasing dashboard").click()
    page.wait_for_url("**/admin/leasing/workitem/dashboard/")

    # The charts are drawn and visible.
    retry_chart = page.locator("#leasing-retry-chart")
    assert retry_chart.is_visible()
    assert retry_chart.locator("rect.leasing-bar-completed").count() >= 1
    assert page.locator("#leasing-throughput-chart").is_visible()
    assert page.locator("#leasing-sweep-status").inner_text().startswith("Recovery sweep OK.")
    stale_tile = page.locator("a.leasing-tile", has_text="Stale heartbeats")
    assert stale_tile.locator(".leasing-tile-value").inner_text() == "2"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

    # Filter the work items by lease health: the stale lease, alone.
    page.get_by_role("link", name="Work items", exact=True).first.click()
    page.get_by_role("link", name="Stale heartbeat", exact=True).click()
    page.wait_for_url("**/admin/leasing/workitem/?lease_health=stale")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert stale_id in rows.first.inner_text()

    # Force-release it through the confirmation page.
    rows.first.locator("input.action-select").check()
    page.select_option("select[name=action]", "force_release_selected")
    page.locator("button[name=index]").first.click()
    assert "are you sure?" in page.locator("h1").inner_text()
    page.fill("textarea[name=reason]", "worker-2 stopped heartbeating")
    page.get_by_role("button", name="Yes, force-release").click()
    assert "1 work item force-released." in page.locator("ul.messagelist").inner_text()
    assert page.locator("#result_list").count() == 0  # nothing is stale any more

    # The item is pending, and its timeline shows the state transition.
    page.goto(f"{live_server.url}/admin/leasing/workitem/{stale_id}/change/")
    assert page.locator(".leasing-status-pending").first.inner_text() == "Pending"
    page.get_by_role("link", name="Checkpoint timeline").click()
    page.wait_for_url("**/admin/leasing/workitem/timeline/task-stale/")
    entry = page.locator("#leasing-timeline li").last
    assert "State transition" in entry.locator(".leasing-cp-state_transition").inner_text()
    assert stale_id in entry.inner_text()

    assert WorkItem.objects.get(pk=stale_id).status == "pending"
    transition = Checkpoint.objects.get(task_id="task-stale", checkpoint_type="state_transition")
    assert transition.snapshot_data["reason"] == "worker-2 stopped heartbeating"
