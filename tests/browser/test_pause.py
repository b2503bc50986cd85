"""Pausing a queue from the dashboard in a real browser stops a real worker claiming it.

Debian's Chromium driven by Playwright (tests/browser/conftest.py; never a
downloaded browser), against the live server, with one `runworker` process
serving two queues. The operator pauses one queue from the dashboard's queue
table through the confirmation page: the worker claims nothing more from it
while the other queue keeps completing; resuming it from the dashboard lets
the worker claim it again. A screenshot of the dashboard with the paused
queue is saved to artifacts/dashboard-paused.png.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache

from leasing import enqueue_many
from leasing.models import Pause, WorkItem
from tests.support.admin import FORCE, VIEW_ALL, make_user
from tests.support.browser import ARTIFACTS, PASSWORD
from tests.support.helpers import wait_for
from tests.support.workers import start_workers, stop_workers

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def claimed(queue: str) -> int:
    return WorkItem.objects.filter(queue_name=queue).exclude(lease_token=0).count()


def completed(queue: str) -> int:
    return WorkItem.objects.filter(queue_name=queue, status="completed").count()


def confirm(page: Any, action: str, reason: str) -> None:
    """Click the emails row's pause or resume link, give a reason, confirm."""
    row = page.locator('#leasing-queue-table tr[data-queue="emails"]')
    row.locator(f'a[data-action="{action}-queue"]').click()
    page.wait_for_url("**/admin/leasing/workitem/pauses/?**")
    assert "emails" in page.locator("#leasing-pause-question").inner_text()
    page.fill("#id_reason", reason)
    page.locator("#leasing-pause-form input[type=submit]").click()
    page.wait_for_url("**/admin/leasing/workitem/dashboard/")


def test_pausing_a_queue_on_the_dashboard_stops_the_worker_claiming_it(
    live_server, page, subprocess_env, tmp_path
):
    cache.clear()
    make_user("operator", *VIEW_ALL, FORCE)
    spec = {"work_type": "test.sleep", "input_data": {"seconds": 0.05}}
    enqueue_many([{**spec, "task_id": f"e-{i}", "queue_name": "emails"} for i in range(400)])
    enqueue_many([{**spec, "task_id": f"r-{i}", "queue_name": "reports"} for i in range(400)])
    with open(tmp_path / "worker.log", "wb") as log:
        workers = start_workers(1, subprocess_env, log, concurrency=2)
        try:
            page.goto(f"{live_server.url}/admin/login/?next=/admin/leasing/workitem/dashboard/")
            page.fill("#id_username", "operator")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/leasing/workitem/dashboard/")
            wait_for(lambda: completed("emails") >= 5, timeout=60)

            confirm(page, "pause", "provider outage (browser test)")
            row = page.locator('#leasing-queue-table tr[data-queue="emails"]').first
            assert "queue paused" in row.inner_text()
            pause = Pause.objects.get()
            assert (pause.name, pause.paused_by) == ("emails", "operator")

            # One claim cycle later the worker takes nothing more from emails,
            # while reports keeps completing.
            reports = completed("reports")
            wait_for(lambda: completed("reports") >= reports + 10, timeout=60)
            held = claimed("emails")
            wait_for(lambda: completed("reports") >= reports + 40, timeout=60)
            assert claimed("emails") == held, "the worker claimed from the paused queue"
            page.reload()
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-paused.png"), full_page=True)

            confirm(page, "resume", "provider back")
            wait_for(lambda: claimed("emails") > held, timeout=60)
            pause.refresh_from_db()
            assert pause.resumed_by == "operator" and pause.resume_reason == "provider back"
        finally:
            stop_workers(workers)
