"""Helpers shared by the admin, dashboard, metrics and browser tests (no tests here).

`lease_scenario()` builds one item in each lease health and status, with a
distinctive secret in every kind of payload, so each test can assert both
what a page shows and what it must not show.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from html.parser import HTMLParser
from typing import Any

import django
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from leasing import Lease, LeaseManager, create_checkpoint, enqueue
from leasing.models import IdempotencyKey, Worker, WorkItem
from tests.support.helpers import database_now

# Appears in every payload of the scenario; never in a page without view_payload.
SECRET = "S3CRET-payload-7f1c9e"

VIEW_ALL = (
    "leasing.view_workitem",
    "leasing.view_checkpoint",
    "leasing.view_idempotencykey",
    "leasing.view_worker",
)
FORCE = "leasing.force_release_workitem"
PAYLOAD = "leasing.view_payload"


def make_user(username: str, *perms: str, staff: bool = True, superuser: bool = False) -> Any:
    """A user with exactly the given `app_label.codename` permissions."""
    user_model = get_user_model()
    user = user_model.objects.create_user(
        username, f"{username}@example.com", "pw-for-tests-1", is_staff=staff
    )
    if superuser:
        user.is_superuser = True
        user.save(update_fields=["is_superuser"])
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return user_model.objects.get(pk=user.pk)  # no cached permissions


def shift(item_id: str, **offsets: float | None) -> None:
    """Set timestamp columns to `database now + offset seconds` (None: NULL)."""
    now = database_now()
    WorkItem.objects.filter(pk=item_id).update(
        **{
            column: None if seconds is None else now + timedelta(seconds=seconds)
            for column, seconds in offsets.items()
        }
    )


def claim(task_id: str, worker: str = "worker-1", **enqueue_fields: Any) -> Lease:
    """Enqueue one item of its own task and claim it for `worker`."""
    item = enqueue(task_id, enqueue_fields.pop("work_type", "noop"), **enqueue_fields)
    lease = LeaseManager(worker).acquire_lease(lease_duration_seconds=300, task_id_filter=task_id)
    assert lease is not None and lease.work_item_id == item.pk
    return lease


@dataclass
class Scenario:
    healthy: Lease
    stale: Lease
    expired: Lease
    stuck: Lease  # heartbeat fresh, no progress
    pending: WorkItem
    completed: str
    failed: str

    def ids(self) -> dict[str, str]:
        return {
            "healthy": self.healthy.work_item_id,
            "stale": self.stale.work_item_id,
            "expired": self.expired.work_item_id,
            "stuck": self.stuck.work_item_id,
            "pending": self.pending.pk,
            "completed": self.completed,
            "failed": self.failed,
        }


def lease_scenario() -> Scenario:
    """One item per lease health and status, payloads everywhere carrying SECRET.

    Its holders have no worker row, so its leases are at risk until a test
    registers them (`register_holders`).
    """
    payload = {"card": SECRET, "amount": 12}
    healthy = claim("task-healthy", "worker-1", input_data=payload, work_type="send_invoice")
    shift(healthy.work_item_id, progress_at=-5)
    stale = claim("task-stale", "worker-2", work_type="resize_image", queue_name="media")
    shift(stale.work_item_id, heartbeat_at=-200)
    expired = claim("task-expired", "worker-3", work_type="resize_image")
    shift(expired.work_item_id, lease_expires_at=-30, heartbeat_at=-400)
    stuck = claim("task-stuck", "worker-1", work_type="send_invoice")
    shift(stuck.work_item_id, lease_acquired_at=-600, heartbeat_at=-2)
    pending = enqueue("task-pending", "send_invoice", input_data=payload, queue_name="billing")

    done = claim("task-done", "worker-1", input_data=payload)
    LeaseManager("worker-1").release_lease(
        done.work_item_id, success=True, output_data={"receipt": SECRET}, token=done.token
    )
    bad = claim("task-bad", "worker-2", max_retries=0)
    LeaseManager("worker-2").release_lease(
        bad.work_item_id, success=False, error="boom", token=bad.token
    )

    create_checkpoint(
        "task-healthy",
        "iteration_start",
        {"step": 1, "secret": SECRET},
        metadata={"note": SECRET},
        lease=healthy,
    )
    create_checkpoint(
        "task-healthy", "error_boundary", {"error": f"failed on {SECRET}"}, lease=healthy
    )
    IdempotencyKey.objects.create(
        idempotency_key="key-1",
        task_id="task-done",
        work_item_id=done.work_item_id,
        request_hash="sha256:" + "0" * 64,
        response_data={"answer": SECRET},
        status="completed",
    )
    return Scenario(
        healthy=healthy,
        stale=stale,
        expired=expired,
        stuck=stuck,
        pending=pending,
        completed=done.work_item_id,
        failed=bad.work_item_id,
    )


HOLDERS = ("worker-1", "worker-2", "worker-3")

# The name of the item page's action menu: Django's own on the change form (6.1), or the
# console's, posted to the list as for one ticked row (6.0, which has no change-form actions).
ITEM_MENU = "CHANGE_FORM-action" if django.VERSION >= (6, 1) else "action"


def register_holders(*worker_ids: str, status: str = "running") -> None:
    """Rows for the scenario's lease holders, seen just now (alive while running)."""
    for worker_id in worker_ids or HOLDERS:
        Worker.objects.update_or_create(
            worker_id=worker_id,
            defaults={"hostname": "host", "pid": 1, "status": status, "heartbeat_interval": 30},
        )


def changelist_url(query: str = "") -> str:
    return reverse("admin:leasing_workitem_changelist") + (f"?{query}" if query else "")


def change_url(item_id: str) -> str:
    return reverse("admin:leasing_workitem_change", args=[item_id])


def dashboard_url(query: str = "") -> str:
    return reverse("admin:leasing_workitem_dashboard") + (f"?{query}" if query else "")


def timeline_url(task_id: str) -> str:
    return reverse("admin:leasing_workitem_timeline", args=[task_id])


class _FormParser(HTMLParser):
    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id = form_id
        self.inside = False
        self.fields: list[tuple[str, str]] = []
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form" and a.get("id") == self.form_id:
            self.inside = True
        elif self.inside and tag == "input" and a.get("name") and a.get("type") != "submit":
            self.fields.append((a["name"] or "", a.get("value") or ""))
        elif self.inside and tag == "textarea":
            self._textarea = a.get("name")
            self.fields.append((self._textarea or "", ""))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            name, value = self.fields[-1]
            self.fields[-1] = (name, value + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea" and self._textarea is not None:
            name, value = self.fields[-1]
            # Browsers drop the newline that follows <textarea>.
            self.fields[-1] = (name, value.removeprefix("\n"))
            self._textarea = None
        elif tag == "form" and self.inside:
            self.inside = False


def form_fields(html: str, form_id: str) -> dict[str, list[str]]:
    """The fields a browser would submit from form `form_id`, as a QueryDict-like dict."""
    parser = _FormParser(form_id)
    parser.feed(html)
    if not parser.fields:
        raise AssertionError(f"no form #{form_id} with fields in the page")
    fields: dict[str, list[str]] = {}
    for name, value in parser.fields:
        fields.setdefault(name, []).append(value)
    return fields


def start_action(client: Client, action: str, *item_ids: str) -> Any:
    """Choose an action on the change list and press Go (what the admin form posts)."""
    return client.post(
        changelist_url(),
        {"action": action, "_selected_action": list(item_ids), "index": "0"},
    )


def confirm(client: Client, page: Any, **changes: str | None) -> Any:
    """Submit the confirmation page's form, optionally altering fields."""
    fields = form_fields(page.content.decode(), "leasing-operator-form")
    fields.pop("csrfmiddlewaretoken", None)
    for name, value in changes.items():
        if value is None:
            fields.pop(name, None)
        else:
            fields[name] = [value]
    return client.post(changelist_url(), fields, follow=True)


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def gauges(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of `leasing_<name>` in /metrics (the tests' METRICS_TOKEN), by its labels."""
    from prometheus_client.parser import text_string_to_metric_families

    body = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken").content.decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == f"leasing_{name}"
    }
