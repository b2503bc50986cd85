"""Issue 42 in a real browser: live refresh without a reload (paused while the tab is
hidden), cancel / delete / run now offered and done by status, and the search in
payloads with and without the payload permission. Chromium through Playwright.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.sessions.models import Session

from leasing import LeaseManager, create_checkpoint, enqueue
from leasing.models import Checkpoint, WorkItem
from tests.support.admin import ITEM_MENU, VIEW_ALL, claim, make_user
from tests.support.browser import log_in, operator, shot
from tests.support.helpers import database_now, row

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

COUNT_REFRESHES = """() => {
    window.leasingMarker = "no reload since";
    window.leasingRefreshes = 0;
    document.addEventListener("leasing:refreshed", () => { window.leasingRefreshes += 1; });
}"""
SET_VISIBILITY = """(state) => {
    Object.defineProperty(document, "visibilityState", {value: state, configurable: true});
    document.dispatchEvent(new Event("visibilitychange"));
}"""


def fragment_requests(page: Any) -> list[str]:
    seen: list[str] = []
    page.on(
        "request",
        lambda request: (
            seen.append(request.url) if request.headers.get("x-leasing-fragment") else None
        ),
    )
    return seen


def test_the_list_refreshes_in_place_and_pauses_while_the_tab_is_hidden(live_server, page):
    enqueue("task-before", "noop")
    operator()
    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/admin/leasing/workitem/")
    assert "refreshes every 5 s" in page.locator(".leasing-live").inner_text()
    fetched = fragment_requests(page)
    page.evaluate(COUNT_REFRESHES)

    enqueue("task-arrived-later", "noop")
    page.wait_for_selector("#result_list >> text=task-arrived-later", timeout=12_000)
    assert page.evaluate("window.leasingMarker") == "no reload since"  # swapped, not reloaded
    assert page.evaluate("window.leasingRefreshes") >= 1
    assert fetched, "the refresh fetched no fragment"

    page.evaluate(SET_VISIBILITY, "hidden")
    assert page.evaluate("document.documentElement.dataset.leasingRefreshState") == "paused"
    before = len(fetched)
    page.wait_for_timeout(7_000)  # more than one 5 s period
    assert len(fetched) == before, "fetched while the tab was hidden"

    enqueue("task-while-hidden", "noop")
    page.evaluate(SET_VISIBILITY, "visible")
    page.wait_for_selector("#result_list >> text=task-while-hidden", timeout=3_000)
    assert page.evaluate("document.documentElement.dataset.leasingRefreshState") == "live"
    assert page.evaluate("window.leasingMarker") == "no reload since"


def test_the_dashboard_refreshes_its_panels_every_5_s_without_a_reload(live_server, page):
    operator()
    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/admin/leasing/workitem/dashboard/")
    fetched = fragment_requests(page)
    page.evaluate(COUNT_REFRESHES)
    page.wait_for_function("window.leasingRefreshes >= 1", timeout=12_000)
    assert page.evaluate("window.leasingMarker") == "no reload since"
    assert any("/dashboard/" in url for url in fetched)


def test_the_dashboard_says_the_session_ended_instead_of_looking_updated(live_server, page):
    operator()
    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/admin/leasing/workitem/dashboard/")
    stamp = page.locator("[data-leasing-updated]")
    page.evaluate(COUNT_REFRESHES)
    page.wait_for_function("window.leasingRefreshes >= 1", timeout=12_000)
    # Just after a refresh: the next is 5 s away, so nothing is on its way.
    Session.objects.all().delete()
    updated = stamp.inner_text()
    assert updated.startswith("updated ")

    # The next refresh follows the redirect to the login page (200, no panels).
    with page.expect_response(lambda r: "/admin/login/" in r.url, timeout=12_000):
        pass
    page.wait_for_function(
        "(before) => document.querySelector('[data-leasing-updated]').textContent !== before",
        arg=updated,
    )
    said = stamp.inner_text()
    assert said.startswith("session ended: these figures are from "), said
    assert updated.removeprefix("updated ") in said  # the time of the last real refresh
    assert "updated" not in said and "leasing-bad-text" in stamp.get_attribute("class")
    assert stamp.get_by_role("link", name="reload to sign in again").count() == 1
    assert page.evaluate("document.documentElement.dataset.leasingRefreshState") == "signed-out"
    assert page.evaluate("window.leasingRefreshes") == 1
    assert page.evaluate("window.leasingMarker") == "no reload since"
    assert page.locator('[data-leasing-panel="tiles"] a.leasing-tile').count() > 0  # kept

    # Signed in again (another tab of the same browser): the page is live again.
    other = page.context.new_page()
    log_in(other, live_server, "operator")
    other.close()
    page.wait_for_function("window.leasingRefreshes >= 2", timeout=12_000)
    assert stamp.inner_text().startswith("updated ")
    assert page.evaluate("document.documentElement.dataset.leasingRefreshState") == "live"


ITEM_ACTION = f"select[name='{ITEM_MENU}']"


def _choose(page: Any, live_server: Any, item_id: str) -> set[str]:
    page.goto(f"{live_server.url}/admin/leasing/workitem/{item_id}/change/")
    options = page.locator(f"{ITEM_ACTION} option")
    return {v for v in options.evaluate_all("(os) => os.map((o) => o.value)") if v}


def _run(page: Any, action: str, reason: str) -> None:
    page.select_option(ITEM_ACTION, action)
    page.locator("button[name=index]").first.click()
    page.fill("textarea[name=reason]", reason)
    page.locator("input[type=submit][value^='Yes, ']").click()


def test_cancel_delete_and_run_now_by_status_from_the_item_page(live_server, page):
    running = claim("task-running", "worker-1").work_item_id
    pending = enqueue("task-pending", "noop").pk
    later = enqueue("task-later", "noop", run_after=database_now().replace(year=2099)).pk
    operator()
    log_in(page, live_server, "operator")

    assert _choose(page, live_server, running) == {
        "force_release_selected",
        "force_fail_selected",
        "cancel_selected",
    }
    _run(page, "cancel_selected", "the customer withdrew")
    assert row(running)["cancel_requested_at"] is not None
    assert "cancel_selected" not in _choose(page, live_server, running)  # asked already

    offered = _choose(page, live_server, later)
    assert {"run_now_selected", "delete_items_selected", "cancel_selected"} <= offered
    _run(page, "run_now_selected", "the partner is back")
    assert row(later)["run_after"] <= database_now()
    assert "run_now_selected" not in _choose(page, live_server, later)

    assert "run_now_selected" not in _choose(page, live_server, pending)
    _run(page, "delete_items_selected", "enqueued by mistake")
    page.wait_for_url(f"{live_server.url}/admin/leasing/workitem/**")
    assert "1 work item deleted." in page.locator("ul.messagelist").inner_text()
    assert not WorkItem.objects.filter(pk=pending).exists()
    record = Checkpoint.objects.get(task_id="task-pending", checkpoint_type="state_transition")
    assert record.snapshot_data["reason"] == "enqueued by mistake"
    shot(page, "item-actions-after-delete")


def test_payload_search_with_and_without_the_payload_permission(live_server, page):
    acme = enqueue("task-acme", "invoice", input_data={"customer": "acme"}).pk
    enqueue("task-initech", "invoice", input_data={"customer": "initech"})
    operator()  # has the payload permission
    make_user("viewer", *VIEW_ALL)
    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/admin/leasing/workitem/")
    page.fill("#leasing-payload", "customer=acme")
    page.get_by_role("button", name="Search payloads").click()
    page.wait_for_url("**payload=customer*")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1 and acme in rows.first.inner_text()
    shot(page, "payload-search")

    page.context.clear_cookies()
    log_in(page, live_server, "viewer")
    page.goto(f"{live_server.url}/admin/leasing/workitem/?input__customer=acme")
    assert page.locator("#leasing-payload-search").count() == 0
    assert "permission" in page.locator("#leasing-ignored").inner_text()
    assert page.locator("#result_list tbody tr").count() == 2  # not filtered


def test_a_running_tasks_timeline_shows_new_checkpoints_without_a_reload(live_server, page):
    lease = claim("task-at-work", "worker-1")
    create_checkpoint("task-at-work", "iteration_start", {"step": 1}, lease=lease)
    done = claim("task-done", "worker-1")
    LeaseManager("worker-1").release_lease(done.work_item_id, True, token=done.token)
    operator()
    log_in(page, live_server, "operator")

    page.goto(f"{live_server.url}/admin/leasing/workitem/timeline/task-done/")
    assert page.locator("[data-leasing-refresh]").count() == 0  # finished: nothing to refresh

    page.goto(f"{live_server.url}/admin/leasing/workitem/timeline/task-at-work/")
    page.evaluate(COUNT_REFRESHES)
    assert page.locator("#leasing-timeline > li").count() == 1
    create_checkpoint("task-at-work", "iteration_end", {"step": 1}, lease=lease)
    page.wait_for_selector("#seq-2", timeout=12_000)
    assert page.evaluate("window.leasingMarker") == "no reload since"
