"""The console at phone width (issue 42): no page is wider than a 390 px screen.

Every console page, with data in every status and real failed runs, opened in
Chromium at 390 x 844: the document's scroll width stays within the viewport
(wide tables scroll inside their own box). Each page is saved as
artifacts/phone-<name>.png.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.core.cache import cache

from leasing import pause
from leasing.models import Worker
from tests.support.admin import lease_scenario
from tests.support.browser import log_in, operator, run_failures, shot
from tests.support.helpers import database_now

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


def test_no_console_page_overflows_a_390_px_screen(
    live_server, browser, leasing_settings: Callable[..., None]
):
    cache.clear()
    scenario = lease_scenario()
    failed = run_failures(leasing_settings)
    pause(queue="media", by="operator", reason="a very long reason " * 8)
    Worker.objects.create(
        worker_id="worker-with-a-rather-long-name@host-with-a-long-name.example.com",
        hostname="host-with-a-long-name.example.com",
        pid=11,
        concurrency=2,
    )
    Worker.objects.create(
        worker_id="sweeper@host-1",
        role="sweeper",
        hostname="host-1",
        pid=12,
        last_scan_at=database_now(),
        scans=1,
    )
    operator()
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        log_in(page, live_server, "operator")
        base = f"{live_server.url}/admin/leasing/workitem"
        pages = {
            "dashboard": "/dashboard/?refresh=0",
            "pauses": "/pauses/",
            "timeline": "/timeline/task-fail-0/",
            "timeline-leased": "/timeline/task-healthy/",
            "errors": "/errors/",
            "history": "/history/",
            "history-7d": "/history/?window=10080",
            "work-items": "/",
            "work-items-ignored": "/?status=zzz&input__customer=acme",
            "work-item-failed": f"/{failed['value_error'][0]}/change/",
            "work-item-leased": f"/{scenario.healthy.work_item_id}/change/",
        }
        widths = {}
        for name, path in pages.items():
            response = page.goto(base + path)
            assert response is not None and response.status == 200, (name, path)
            widths[name] = page.evaluate("document.documentElement.scrollWidth")
            shot(page, f"phone-{name}")
        too_wide = {name: w for name, w in widths.items() if w > PHONE["width"]}
        assert not too_wide, f"wider than {PHONE['width']} px: {too_wide}"
    finally:
        context.close()
