"""Every page of the console in a real browser, each saved as a full-page screenshot.

With data in every status (the admin scenario, real failed runs, a worker and
a sweeper), an operator opens each leasing admin page: it answers 200, shows
its heading, raises no JavaScript error, and is saved to
artifacts/page-<name>.png (git-ignored) for a human to look at.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.core.cache import cache

from leasing.models import Checkpoint, Worker
from tests.support.admin import (
    FORCE,
    PAYLOAD,
    VIEW_ALL,
    lease_scenario,
    make_user,
    register_holders,
    shift,
)
from tests.support.browser import log_in, run_failures, shot
from tests.support.helpers import database_now

pytestmark = [pytest.mark.long, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_every_console_page_renders_and_is_captured(
    live_server, page, leasing_settings: Callable[..., None]
):
    cache.clear()
    scenario = lease_scenario()
    register_holders("worker-2", "worker-3")  # alive holders: the stale lease is stale, not at risk
    failed = run_failures(leasing_settings)
    Worker.objects.create(worker_id="worker-1", hostname="host-1", pid=11, concurrency=2)
    Worker.objects.create(
        worker_id="sweeper@host-1",
        role="sweeper",
        hostname="host-1",
        pid=12,
        last_scan_at=database_now(),
        scans=1,
    )
    checkpoint = Checkpoint.objects.filter(checkpoint_type="error_boundary").first()
    assert checkpoint is not None
    # The operator of tests.support.browser, who may also read the schedules.
    make_user("operator", *VIEW_ALL, FORCE, PAYLOAD, "leasing.view_schedule")
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    log_in(page, live_server, "operator")

    base = f"{live_server.url}/admin"
    item = failed["value_error"][0]
    pages: dict[str, tuple[str, str]] = {
        "admin-index": ("/", "Site administration"),
        "app-index": ("/leasing/", "Leasing"),
        "dashboard": ("/leasing/workitem/dashboard/?refresh=0", "Leasing dashboard"),
        "history": ("/leasing/workitem/history/", "History and lease analytics"),
        "history-7d": ("/leasing/workitem/history/?window=10080", "History and lease analytics"),
        "top-errors": ("/leasing/workitem/errors/", "Top errors"),
        "work-items": ("/leasing/workitem/", "Select work item"),
        "work-items-expired": ("/leasing/workitem/?lease_health=expired", "Select work item"),
        "work-items-at-risk": ("/leasing/workitem/?lease_health=at_risk", "Select work item"),
        "work-items-retrying": ("/leasing/workitem/?retrying=yes", "Select work item"),
        "history-queue": ("/leasing/workitem/history/?queue=default", "History and lease"),
        "pauses": ("/leasing/workitem/pauses/", "Paused now"),
        "schedules": ("/leasing/schedule/", "Select schedule"),
        "work-item": (f"/leasing/workitem/{item}/change/", "test.always_fail"),
        "work-item-leased": (
            f"/leasing/workitem/{scenario.healthy.work_item_id}/change/",
            "send_invoice",
        ),
        "work-item-changes": (f"/leasing/workitem/{item}/history/", "Change history"),
        "timeline": ("/leasing/workitem/timeline/task-fail-0/", "Checkpoint timeline"),
        "checkpoints": ("/leasing/checkpoint/", "Select checkpoint"),
        "checkpoint": (f"/leasing/checkpoint/{checkpoint.pk}/change/", "View checkpoint"),
        "idempotency-keys": ("/leasing/idempotencykey/", "Select idempotency key"),
        "idempotency-key": ("/leasing/idempotencykey/key-1/change/", "View idempotency key"),
        "workers": ("/leasing/worker/", "Select worker"),
        "worker": ("/leasing/worker/worker-1/change/", "View worker"),
        "sweeper": ("/leasing/worker/sweeper@host-1/change/", "View worker"),
    }
    for name, (path, heading) in pages.items():
        response = page.goto(base + path)
        assert response is not None and response.status == 200, (name, path)
        text = page.locator("#content").inner_text()
        assert heading.lower() in text.lower(), (name, heading)
        shot(page, f"page-{name}")

    # The two confirmation pages: an operator action on ticked rows, and a group retry.
    # The holders are seen again and the stale lease renewed first: on a loaded host the
    # pages above can outlast a holder's silence (its lease would read at risk) or the
    # lease itself (expired), and the stale filter would list nothing to tick.
    register_holders("worker-2", "worker-3")
    shift(scenario.stale.work_item_id, lease_expires_at=300)
    page.goto(f"{base}/leasing/workitem/?lease_health=stale")
    page.locator("#result_list tbody tr input.action-select").first.check()
    page.select_option("select[name=action]", "force_fail_selected")
    page.locator("button[name=index]").first.click()
    assert "are you sure?" in page.locator("h1").inner_text()
    shot(page, "page-action-confirmation")
    page.goto(f"{base}/leasing/workitem/errors/")
    page.locator("#leasing-error-groups tr", has_text="ValueError").get_by_role(
        "link", name="Retry this group"
    ).click()
    assert "3 work items" in page.locator("#leasing-bulk-count").inner_text()
    shot(page, "page-errors-retry-confirmation")

    assert errors == []
