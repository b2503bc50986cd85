"""The operator console in a real browser, driven as an operator would.

Debian's Chromium through Playwright (the fixtures of tests/browser/conftest.py),
against the live test server:

* a real `runworker` killed with SIGKILL turns red ("silent …") on the
  dashboard within three of its own heartbeat intervals, with no sweep running;
* a failed item's page shows its formatted traceback and its attempts;
* retrying an error group from "Top errors" puts its items back to pending;
* the dashboard panels and the work item list refresh in place: no page
  reload, an opened <details> stays open.

Screenshots go to artifacts/ (git-ignored); tests/browser/test_every_page.py
captures every console page.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from leasing import enqueue, enqueue_many
from leasing.admin.options import WorkItemAdmin
from leasing.models import Worker, WorkItem
from tests.support.browser import log_in, operator, shot
from tests.support.workers import leasing_env

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HEARTBEAT = 1.0  # the killed worker's own interval: silent after 3 s
SILENT_INTERVALS = 3


def test_a_killed_worker_turns_silent_on_the_dashboard_with_no_sweep_running(
    live_server, page, spawn
):
    operator()
    proc = spawn(
        "manage.py",
        "runworker",
        "--worker-id",
        "doomed-worker",
        env=leasing_env(
            HEARTBEAT_INTERVAL=HEARTBEAT, LEASE_DURATION=10, POLL_INTERVAL=0.2, LISTEN=False
        ),
    )
    deadline = time.monotonic() + 30
    while not Worker.objects.filter(worker_id="doomed-worker", status="running").exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the worker never registered"
        time.sleep(0.1)
    assert Worker.objects.get(worker_id="doomed-worker").heartbeat_interval == HEARTBEAT

    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/admin/leasing/workitem/dashboard/?refresh=0")
    row = page.locator('tr[data-worker="doomed-worker"]')
    assert "seen" in row.inner_text()
    assert "leasing-row-bad" not in (row.get_attribute("class") or "")

    proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    proc.wait(timeout=10)
    # The operator reloads until the row turns red; nothing else changes the row.
    while True:
        page.reload()
        row = page.locator('tr[data-worker="doomed-worker"]')
        if "leasing-row-bad" in (row.get_attribute("class") or ""):
            break
        assert time.monotonic() - killed < 45, "the killed worker never turned silent"
        time.sleep(0.2)
    took = time.monotonic() - killed
    # Silent after 3 intervals since its last beat (at most one interval before
    # the kill), plus page reloads on a loaded host (seconds each with two
    # cores shared by several suites). With the configured 30 s interval
    # instead of the worker's own it would take 90 s; waiting for a sweep, forever.
    assert took < (SILENT_INTERVALS + 1) * HEARTBEAT + 12, took
    text = row.inner_text()
    assert "silent" in text
    assert "silent after 3 s" in text
    shot(page, "dashboard-silent-worker")

    # No sweep ran: the row still says running; the console judged it alone.
    assert not Worker.objects.filter(role="sweeper").exists()
    assert Worker.objects.get(worker_id="doomed-worker").status == "running"
    assert "No recovery sweep has ever run" in page.locator("#leasing-sweep-status").inner_text()

    # The worker list and the worker's page say the same.
    page.goto(f"{live_server.url}/admin/leasing/worker/")
    listed = page.locator("#result_list tbody tr", has_text="doomed-worker")
    assert listed.locator(".leasing-worker-lost").inner_text() == "Silent"
    assert "silent" in listed.locator(".leasing-bad-text").inner_text()
    shot(page, "worker-list-silent")
    listed.get_by_role("link", name="doomed-worker").click()
    page.wait_for_url("**/admin/leasing/worker/doomed-worker/change/")
    assert page.locator(".leasing-worker-lost").first.inner_text() == "Silent"


def test_a_failed_item_shows_its_traceback_and_attempts(live_server, page, failures):
    operator()
    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/admin/leasing/workitem/dashboard/?refresh=0")
    page.get_by_role("link", name="Top errors").first.click()
    group = page.locator("#leasing-error-groups tr", has_text="ValueError")
    assert group.locator("td.num strong").inner_text() == "3"
    example = group.locator("td.leasing-lease-ids a").first
    item_id = example.inner_text()
    assert item_id in failures["value_error"]
    example.click()
    page.wait_for_url(f"**/admin/leasing/workitem/{item_id}/change/")

    last = page.locator("#leasing-last-error")
    assert "this always fails" in last.locator("strong").inner_text()
    assert "ValueError" in last.locator("code").inner_text()
    traceback = page.locator("#leasing-traceback").inner_text()
    assert traceback.startswith("Traceback (most recent call last):")
    assert "tests/testapp/handlers.py" in traceback
    assert 'raise ValueError("this always fails")' in traceback
    assert traceback.rstrip().endswith("ValueError: this always fails")
    # A formatted traceback keeps its lines (a <pre>), not one run-on line.
    assert traceback.count("\n") >= 4

    attempts = page.locator("#leasing-attempts tbody tr")
    assert attempts.count() == 2
    first, second = attempts.nth(0).inner_text(), attempts.nth(1).inner_text()
    assert "handler failed: retry scheduled" in first
    assert "worker-fails" in first
    assert "handler failed: no retries left" in second
    assert "this always fails" in second
    shot(page, "item-failed-traceback")

    # The permanent error says it was not retried.
    page.goto(f"{live_server.url}/admin/leasing/workitem/{failures['permanent'][0]}/change/")
    only = page.locator("#leasing-attempts tbody tr")
    assert only.count() == 1
    assert "permanent error, not retried" in only.inner_text()


def test_retrying_an_error_group_puts_its_items_back_to_pending(live_server, page, failures):
    operator()
    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/admin/leasing/workitem/errors/")
    group = page.locator("#leasing-error-groups tr", has_text="ValueError")
    retry = group.get_by_role("link", name="Retry this group")
    # One line: the button used to wrap inside its narrow cell, split in two boxes.
    assert retry.evaluate("a => a.getClientRects().length") == 1
    retry.click()
    assert "3 work items" in page.locator("#leasing-bulk-count").inner_text()
    shot(page, "errors-retry-confirmation")
    page.fill("textarea[name=reason]", "the upstream bug is fixed")
    page.get_by_role("button", name="Yes, retry 3 items").click()
    page.wait_for_url("**/admin/leasing/workitem/errors/?window=1440")
    assert "3 work items" in page.locator("ul.messagelist").inner_text()
    # The group is gone; the permanent error's group is still there.
    assert page.locator("#leasing-error-groups tr", has_text="ValueError").count() == 0
    assert page.locator("#leasing-error-groups tr", has_text="PermanentError").count() == 1

    page.goto(f"{live_server.url}/admin/leasing/workitem/?status__exact=pending")
    listed = page.locator("#result_list tbody").inner_text()
    for pk in failures["value_error"]:
        assert pk in listed
    assert page.locator("#result_list tbody tr").count() == 3
    statuses = WorkItem.objects.filter(pk__in=failures["value_error"]).values_list(
        "status", flat=True
    )
    assert set(statuses) == {"pending"}
    assert WorkItem.objects.get(pk=failures["permanent"][0]).status == "failed"


def navigations(page: Any) -> int:
    return page.evaluate("performance.getEntriesByType('navigation').length")


def test_dashboard_panels_refresh_in_place_and_keep_open_details(live_server, page, failures):
    operator()
    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/admin/leasing/workitem/dashboard/?refresh=5")
    backlog = page.locator("a.leasing-tile", has_text="Pending backlog")
    assert backlog.locator(".leasing-tile-value").inner_text() == "0"
    details = page.locator("#leasing-recoveries details[data-key]").first
    key = details.get_attribute("data-key")
    details.locator("summary").click()
    assert details.evaluate("d => d.open")
    details.evaluate("d => { d.leasingOld = true; }")  # to tell a swapped node from this one
    page.evaluate("window.leasingMarker = 'still the same page'")

    enqueue_many([{"task_id": f"task-new-{i}", "work_type": "noop"} for i in range(2)])
    # The next refresh (5 s) shows the new backlog without reloading the page.
    page.wait_for_function(
        """() => Array.from(document.querySelectorAll("a.leasing-tile")).some(
            t => t.textContent.includes("Pending backlog")
            && t.querySelector(".leasing-tile-value").textContent.trim() === "2")""",
        timeout=15_000,
    )
    assert page.evaluate("window.leasingMarker") == "still the same page"
    assert navigations(page) == 1
    reopened = page.locator(f'#leasing-recoveries details[data-key="{key}"]')
    # Its panel was replaced by the fresh one, and the new <details> was opened again.
    assert reopened.evaluate("d => d.leasingOld === undefined")
    assert reopened.evaluate("d => d.open")
    assert "updated" in page.locator("[data-leasing-updated]").inner_text()
    shot(page, "dashboard-refreshed")


def test_the_work_item_list_refreshes_in_place(live_server, page, monkeypatch):
    monkeypatch.setattr(WorkItemAdmin, "list_refresh_seconds", 2)
    operator()
    enqueue("task-old", "noop")
    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/admin/leasing/workitem/")
    assert page.locator("#result_list tbody tr").count() == 1
    page.evaluate("window.leasingMarker = 'list'")
    fresh = enqueue("task-fresh", "noop")
    page.locator("#result_list tbody tr", has_text=fresh.pk).wait_for(timeout=15_000)
    assert page.locator("#result_list tbody tr").count() == 2
    assert page.evaluate("window.leasingMarker") == "list"
    assert navigations(page) == 1
    # The refreshed rows still work with Django's actions: ticking one counts it.
    page.locator("#result_list tbody tr", has_text=fresh.pk).locator("input.action-select").check()
    assert "1 of 2 selected" in page.locator(".action-counter").inner_text()
    shot(page, "work-items-refreshed")

    # While a row is ticked the list stands still, so the selection is not lost...
    later = enqueue("task-later", "noop")
    time.sleep(WorkItemAdmin.list_refresh_seconds + 1.5)
    assert page.locator("#result_list tbody tr").count() == 2
    assert page.locator("#result_list tbody tr input.action-select:checked").count() == 1
    # ...and refreshes again once it is unticked.
    page.locator("#result_list tbody tr", has_text=fresh.pk).locator(
        "input.action-select"
    ).uncheck()
    page.locator("#result_list tbody tr", has_text=later.pk).wait_for(timeout=15_000)
    assert page.evaluate("window.leasingMarker") == "list"


def test_a_row_ticked_while_a_refresh_is_in_flight_stays_ticked(live_server, page, monkeypatch):
    monkeypatch.setattr(WorkItemAdmin, "list_refresh_seconds", 2)
    operator()
    first = enqueue("task-first", "noop")
    log_in(page, live_server, "operator")
    held: list[Any] = []

    def hold(route: Any) -> None:
        if route.request.headers.get("x-leasing-fragment") and not held:
            held.append(route)
        else:
            route.continue_()

    page.route("**/admin/leasing/workitem/**", hold)
    page.goto(f"{live_server.url}/admin/leasing/workitem/")
    deadline = time.monotonic() + 15
    while not held:  # a refresh has been sent; its answer is held back
        assert time.monotonic() < deadline, "no refresh was sent"
        page.wait_for_timeout(100)
    enqueue("task-second", "noop")  # the held answer will show two rows
    row = page.locator("#result_list tbody tr", has_text=first.pk)
    row.locator("input.action-select").check()
    with page.expect_response(lambda r: r.request.headers.get("x-leasing-fragment") == "1"):
        held[0].continue_()
    page.wait_for_timeout(1000)  # the answer is handled
    # The answer arrived after the tick: the list was left alone, the tick kept.
    assert row.locator("input.action-select").is_checked()
    assert page.locator("#result_list tbody tr").count() == 1
    assert "1 of 1 selected" in page.locator(".action-counter").inner_text()
