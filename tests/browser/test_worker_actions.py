"""Quiet and stop of a real `runworker` from the workers list, in Chromium.

The operator sees the worker's runs (busy, idle), quiets it with a reason
(it stops claiming within a beat, and the list says quiet), then stops it (it
exits 0 and its row says stopped).
"""

from __future__ import annotations

import pytest

from leasing import enqueue
from leasing.models import Worker
from tests.support.admin import FORCE, VIEW_ALL, make_user
from tests.support.browser import PASSWORD
from tests.support.helpers import row, wait_for
from tests.support.workers import leasing_env

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _act(page, action: str, reason: str) -> None:
    page.locator("#result_list tbody tr", has_text="w-browser").locator(
        "input.action-select"
    ).check()
    page.select_option("select[name=action]", action)
    page.locator("button[name=index]").first.click()
    assert "are you sure?" in page.locator("h1").inner_text()
    page.fill("textarea[name=reason]", reason)
    page.locator("#leasing-worker-request-form input[type=submit]").click()


def test_an_operator_quiets_then_stops_a_running_worker(live_server, page, spawn, tmp_path):
    make_user("operator", *VIEW_ALL, FORCE)
    running = enqueue("running", "test.sleep", {"seconds": 1})
    env = {
        "LEASING_TEST_RECORD": str(tmp_path / "runs.txt"),
        **leasing_env(HEARTBEAT_INTERVAL=0.5, LEASE_DURATION=30),
    }
    proc = spawn(
        "manage.py", "runworker", "--worker-id", "w-browser", "--concurrency", "2", env=env
    )
    try:
        wait_for(lambda: Worker.objects.filter(pk="w-browser", status="running").exists(), 60)
        wait_for(lambda: row(running.pk)["status"] == "completed", timeout=30)
        # The list shows the runs of the worker's last beat, which follows the completion.
        wait_for(lambda: Worker.objects.get(pk="w-browser").runs_busy == 0, 15)

        page.goto(f"{live_server.url}/admin/login/?next=/admin/leasing/worker/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        worker_row = page.locator("#result_list tbody tr", has_text="w-browser")
        assert "0 busy, 2 idle" in worker_row.inner_text()

        _act(page, "quiet_selected", "draining the host")
        assert "1 worker asked to go quiet" in page.locator("ul.messagelist").inner_text()
        wait_for(lambda: Worker.objects.get(pk="w-browser").quiet_since is not None, 15)
        later = enqueue("later", "test.noop")
        page.reload()
        assert "quiet" in page.locator("#result_list tbody tr", has_text="w-browser").inner_text()

        _act(page, "stop_selected", "maintenance window")
        assert "1 worker asked to stop" in page.locator("ul.messagelist").inner_text()
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert row(later.pk)["status"] == "pending"  # quiet: never claimed
    assert Worker.objects.get(pk="w-browser").status == "stopped"
