"""The browser tier's helpers: where Chromium is, logging in, screenshots, real failures."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from leasing import enqueue, enqueue_many
from leasing.models import WorkItem
from leasing.worker import WorkerOptions, WorkerRuntime
from tests.support.admin import FORCE, PAYLOAD, VIEW_ALL, make_user
from tests.support.helpers import ROOT

ARTIFACTS = ROOT / "artifacts"
CHROMIUM = os.environ.get("LEASING_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORD = "pw-for-tests-1"


def log_in(page: Any, live_server: Any, username: str) -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def operator() -> Any:
    return make_user("operator", *VIEW_ALL, FORCE, PAYLOAD)


def run_failures(leasing_settings: Callable[..., None]) -> dict[str, list[str]]:
    """Real failed runs: three items raising ValueError twice each, one PermanentError."""
    leasing_settings(RETRY_BACKOFF_BASE=0.05)
    failing = enqueue_many(
        [
            {"task_id": f"task-fail-{i}", "work_type": "test.always_fail", "max_retries": 1}
            for i in range(3)
        ]
    )
    permanent = enqueue("task-permanent", "test.permanent", max_retries=2)
    WorkerRuntime(
        WorkerOptions(
            burst=True,
            poll_interval=1.0,
            worker_id="worker-fails",
            work_types=("test.always_fail", "test.permanent"),
        )
    ).run()
    ids = [item.pk for item in failing]
    assert set(WorkItem.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"failed"}
    assert WorkItem.objects.get(pk=permanent.pk).status == "failed"
    return {"value_error": ids, "permanent": [permanent.pk]}
