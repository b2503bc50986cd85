"""The browser tier: Debian's Chromium driven by Playwright (never a downloaded browser)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.cache import cache

from tests.support.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, run_failures


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"Chromium is not installed at {CHROMIUM}: run scripts/ensure-chromium.sh "
            "(apt-get install chromium chromium-driver)."
        )
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        # Playwright's sync API runs an event loop in this thread; the test's
        # own ORM calls are still synchronous, one at a time.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
            )
            try:
                yield chromium
            finally:
                chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        yield page
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "browser-failure.png"), full_page=True)
        raise
    finally:
        context.close()


@pytest.fixture
def failures(leasing_settings: Callable[..., None]) -> dict[str, list[str]]:
    cache.clear()
    return run_failures(leasing_settings)
