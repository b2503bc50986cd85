"""The admin of the leasing tables: lists, filters, permissions, payloads, read-only tables.

Runs on SQLite and PostgreSQL. The operator actions are exercised the way a
browser submits them (test_admin_actions.py).
"""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from leasing.admin.paginator import EstimatedCountPaginator
from leasing.models import Checkpoint, IdempotencyKey, Worker
from tests.support.admin import (
    FORCE,
    PAYLOAD,
    SECRET,
    VIEW_ALL,
    change_url,
    changelist_url,
    claim,
    form_fields,
    make_user,
    register_holders,
)
from tests.support.helpers import database_now, row

pytestmark = pytest.mark.django_db

ACTIONS = ("force_release_selected", "force_fail_selected", "retry_failed_selected")


# --- the list ---------------------------------------------------------


def test_list_shows_status_badges_lease_remaining_heartbeat_age_retries_and_holder(
    scenario, viewer_client
):
    response = viewer_client.get(changelist_url())
    assert response.status_code == 200
    html = response.content.decode()
    ids = scenario.ids()
    for item_id in ids.values():
        assert item_id in html
    assert 'class="leasing-badge leasing-status-in_progress"' in html
    assert 'class="leasing-badge leasing-status-completed"' in html
    assert 'class="leasing-badge leasing-status-failed"' in html
    # The expired lease is red and says so; the stale heartbeat is amber.
    assert '<span class="leasing-expired"' in html and re.search(r"expired 3\d s ago", html)
    assert '<span class="leasing-stale"' in html
    assert re.search(r"3 min 2\d s ago \(stale\)", html)
    assert "0/3" in html and "0/0" in html  # retries n/max
    assert "worker-3" in html  # holder
    # Links to the task's checkpoint timeline.
    assert '/admin/leasing/workitem/timeline/task-healthy/"' in html


@pytest.mark.parametrize(
    ("health", "expected"),
    [
        ("healthy", {"healthy", "stuck"}),
        ("stale", {"stale"}),
        ("expired", {"expired"}),
        ("no_progress", {"stuck"}),
    ],
)
def test_lease_health_filter(scenario, viewer_client, health, expected):
    register_holders()
    response = viewer_client.get(changelist_url(f"lease_health={health}"))
    assert response.status_code == 200
    shown = {name for name, pk in scenario.ids().items() if pk in response.content.decode()}
    assert shown == expected
    assert response.context["cl"].result_count == len(expected)


def test_lease_health_filter_lists_leases_of_a_lost_holder_as_at_risk(scenario, viewer_client):
    register_holders("worker-2", "worker-3")  # worker-1 holds healthy and stuck: no row
    response = viewer_client.get(changelist_url("lease_health=at_risk"))
    shown = {name for name, pk in scenario.ids().items() if pk in response.content.decode()}
    assert shown == {"healthy", "stuck"}
    response = viewer_client.get(changelist_url("lease_health=healthy"))
    assert response.context["cl"].result_count == 0  # an at-risk lease is never healthy


def test_unknown_lease_health_is_ignored_with_the_pages_message(scenario, viewer_client):
    response = viewer_client.get(changelist_url("lease_health=sleepy"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="leasing-ignored"' in html and "lease_health=sleepy: not one of" in html
    assert response.context["cl"].result_count == len(scenario.ids())


def test_status_work_type_and_queue_filters(scenario, viewer_client):
    ids = scenario.ids()
    html = viewer_client.get(changelist_url("status__exact=pending")).content.decode()
    assert ids["pending"] in html and ids["healthy"] not in html
    html = viewer_client.get(changelist_url("work_type=resize_image")).content.decode()
    assert ids["stale"] in html and ids["expired"] in html and ids["healthy"] not in html
    response = viewer_client.get(changelist_url("queue_name=media"))
    assert {pk for pk in ids.values() if pk in response.content.decode()} == {ids["stale"]}
    # The filter offers the types of handlers, workers and live items.
    work_type_choices = [c["display"] for c in response.context["cl"].filter_specs[2].choices(
        response.context["cl"]
    )]  # fmt: skip
    assert {"send_invoice", "resize_image"} <= set(work_type_choices)


def test_search_by_id_task_and_holder_is_exact(scenario, viewer_client):
    ids = scenario.ids()
    cases = {
        ids["stale"]: {ids["stale"]},
        ids["stale"].lower(): {ids["stale"]},  # pasted ids need not be upper-case
        "task-expired": {ids["expired"]},
        "worker-1": {ids["healthy"], ids["stuck"]},  # holder: only live leases hold one
        f"task-expired {ids['pending']}": {ids["expired"], ids["pending"]},
        "task-exp": set(),  # exact, not a substring search
    }
    for term, expected in cases.items():
        response = viewer_client.get(changelist_url(), {"q": term})
        html = response.content.decode()
        assert {pk for pk in ids.values() if pk in html} == expected, term


def test_search_never_looks_inside_payloads(scenario, viewer_client):
    superuser = Client()
    superuser.force_login(make_user("root", superuser=True))
    for client in (viewer_client, superuser):
        response = client.get(changelist_url(), {"q": SECRET})
        assert response.context["cl"].result_count == 0


def test_change_view_is_read_only_and_links_to_the_timeline(scenario, viewer_client):
    response = viewer_client.get(change_url(scenario.ids()["healthy"]))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="_save"' not in html
    assert "/admin/leasing/workitem/timeline/task-healthy/" in html
    assert "worker-1" in html


def test_nobody_adds_changes_or_deletes_work_items_in_the_admin(scenario):
    client = Client()
    client.force_login(make_user("root", superuser=True))
    item_id = scenario.ids()["healthy"]
    before = row(item_id)
    assert client.get("/admin/leasing/workitem/add/").status_code == 403
    assert client.get(f"/admin/leasing/workitem/{item_id}/delete/").status_code == 403
    response = client.post(change_url(item_id), {"status": "completed", "_save": "Save"})
    assert response.status_code == 403
    assert row(item_id) == before


# --- permissions on the actions ---------------------------------------------------------


def test_staff_with_view_permission_only_sees_no_write_action(scenario, viewer_client):
    response = viewer_client.get(changelist_url())
    assert response.status_code == 200
    html = response.content.decode()
    for action in ACTIONS:
        assert action not in html
    assert 'name="_selected_action"' not in html  # no action checkboxes at all
    change = viewer_client.get(change_url(scenario.ids()["healthy"])).content.decode()
    for action in ACTIONS:
        assert action not in change


@pytest.mark.parametrize("action", ACTIONS)
def test_forged_action_posts_without_permission_change_nothing(scenario, viewer_client, action):
    ids = scenario.ids()
    targets = [ids["healthy"], ids["failed"], ids["pending"]]
    before = {pk: row(pk) for pk in targets}
    checkpoints = Checkpoint.objects.count()
    forged = {
        "action": action,
        "_selected_action": targets,
        "_leasing_confirm": "yes",
        "reason": "forged",
        **{f"token-{pk}": str(before[pk]["lease_token"]) for pk in targets},
        **{f"heartbeat-{pk}": "" for pk in targets},
    }
    # Straight to the confirmation step, and through the action form.
    first = viewer_client.post(changelist_url(), forged)
    second = viewer_client.post(changelist_url(), {**forged, "index": "0"})
    # And the change form's action form.
    third = viewer_client.post(
        change_url(ids["healthy"]),
        {"CHANGE_FORM-action": action, "_selected_action": [ids["healthy"]]},
    )
    assert first.status_code in (200, 302, 403)
    assert second.status_code in (200, 302, 403)
    assert third.status_code == 403
    assert {pk: row(pk) for pk in targets} == before
    assert Checkpoint.objects.count() == checkpoints
    assert not LogEntry.objects.exists()


def test_action_posts_without_csrf_token_are_refused(scenario):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("operator", *VIEW_ALL, FORCE))
    item_id = scenario.ids()["stale"]
    before = row(item_id)
    response = client.post(
        changelist_url(),
        {
            "action": "force_release_selected",
            "_selected_action": [item_id],
            "_leasing_confirm": "yes",
            "reason": "no token",
            f"token-{item_id}": str(before["lease_token"]),
            f"heartbeat-{item_id}": before["heartbeat_at"].isoformat(),
        },
    )
    assert response.status_code == 403
    assert row(item_id) == before
    # The same form with the page's CSRF token goes through.
    page = client.post(
        changelist_url(),
        {
            "action": "force_release_selected",
            "_selected_action": [item_id],
            "index": "0",
            "csrfmiddlewaretoken": client.get(changelist_url()).context["csrf_token"],
        },
    )
    fields = form_fields(page.content.decode(), "leasing-operator-form")
    assert fields["csrfmiddlewaretoken"][0]
    fields["reason"] = ["with token"]
    done = client.post(changelist_url(), fields)
    assert done.status_code == 302
    assert row(item_id)["status"] == "pending"


# --- payloads (view_payload) ---------------------------------------------------------


def test_payloads_only_with_view_payload_permission(scenario):
    ids = scenario.ids()
    checkpoint = Checkpoint.objects.filter(task_id="task-healthy").first()
    urls = [
        changelist_url(),
        change_url(ids["healthy"]),
        change_url(ids["completed"]),
        changelist_url(f"q={SECRET[:10]}"),
        "/admin/leasing/checkpoint/",
        f"/admin/leasing/checkpoint/{checkpoint.pk}/change/",
        "/admin/leasing/idempotencykey/",
        "/admin/leasing/idempotencykey/key-1/change/",
        "/admin/leasing/workitem/timeline/task-healthy/",
        "/admin/leasing/workitem/dashboard/",
    ]
    without = Client()
    without.force_login(make_user("viewer", *VIEW_ALL))
    for url in urls:
        response = without.get(url)
        assert response.status_code == 200, url
        assert SECRET not in response.content.decode(), url

    with_payload = Client()
    with_payload.force_login(make_user("auditor", *VIEW_ALL, PAYLOAD))
    shown = {url for url in urls if SECRET in with_payload.get(url).content.decode()}
    assert shown == {
        change_url(ids["healthy"]),  # input_data
        change_url(ids["completed"]),  # output_data
        f"/admin/leasing/checkpoint/{checkpoint.pk}/change/",  # snapshot, metadata
        "/admin/leasing/idempotencykey/key-1/change/",  # response_data
        "/admin/leasing/workitem/timeline/task-healthy/",  # snapshots
        "/admin/leasing/workitem/dashboard/",  # the error_boundary snapshot
    }


# --- the read-only tables ------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["checkpoint", "idempotencykey", "worker"])
def test_checkpoints_keys_and_workers_are_read_only(scenario, model):
    Worker.objects.create(worker_id="w-1", hostname="h", pid=1)
    pk = {
        "checkpoint": Checkpoint.objects.values_list("pk", flat=True).first(),
        "idempotencykey": "key-1",
        "worker": "w-1",
    }[model]
    client = Client()
    client.force_login(make_user("root", superuser=True))
    assert client.get(f"/admin/leasing/{model}/").status_code == 200
    page = client.get(f"/admin/leasing/{model}/{pk}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.get(f"/admin/leasing/{model}/add/").status_code == 403
    assert client.get(f"/admin/leasing/{model}/{pk}/delete/").status_code == 403
    assert client.post(f"/admin/leasing/{model}/{pk}/change/", {}).status_code == 403
    counts = (Checkpoint.objects.count(), IdempotencyKey.objects.count(), Worker.objects.count())
    response = client.post(
        f"/admin/leasing/{model}/",
        {"action": "delete_selected", "_selected_action": [pk], "post": "yes"},
    )
    assert response.status_code in (200, 302)
    assert (
        Checkpoint.objects.count(),
        IdempotencyKey.objects.count(),
        Worker.objects.count(),
    ) == counts


def test_workers_list_shows_status_role_last_seen_and_counters(viewer_client):
    Worker.objects.create(
        worker_id="w-9", hostname="host-9", pid=99, status="lost", items_completed=41
    )
    Worker.objects.filter(pk="w-9").update(last_seen_at=database_now())
    html = viewer_client.get("/admin/leasing/worker/").content.decode()
    assert "w-9" in html and "host-9" in html and "leasing-worker-lost" in html
    assert "41" in html and "0 s ago" in html


# --- large tables ---------------------------------------------------------


def test_large_lists_are_counted_up_to_a_limit_then_estimated(monkeypatch, viewer_client, vendor):
    for n in range(8):
        claim(f"task-many-{n}")
    monkeypatch.setattr(EstimatedCountPaginator, "exact_limit", 5)
    response = viewer_client.get(changelist_url())
    assert response.status_code == 200
    html = response.content.decode()
    cl = response.context["cl"]
    if vendor == "postgresql":
        assert cl.paginator.is_estimate and ">about</abbr>" in html
        assert cl.result_count > 5
        # The date hierarchy is derived from the bounds, not a DISTINCT over the rows:
        # all rows are from today, so it offers today's day.
        assert "Filter by created at" in html
        today = database_now()
        assert f"created_at__day={today.day}" in html
        assert f"created_at__month={today.month}" in html
    else:
        assert not cl.paginator.is_estimate and cl.result_count == 8
    # A list within the limit is counted exactly.
    filtered = viewer_client.get(changelist_url("q=task-many-3+task-many-4"))
    assert filtered.context["cl"].result_count == 2
    assert not filtered.context["cl"].paginator.is_estimate


def test_dashboard_and_timeline_show_their_tools_once_on_every_django(scenario, viewer_client):
    # Django 6.0 renders `object-tools` inside `content`, which these pages
    # override; 6.1 renders it beside the title. Either way the links are there once.
    dashboard = viewer_client.get("/admin/leasing/workitem/dashboard/?refresh=0")
    assert dashboard.content.decode().count(">Top errors</a>") == 1
    timeline = viewer_client.get("/admin/leasing/workitem/timeline/task-healthy/")
    assert timeline.content.decode().count(">Checkpoint list</a>") == 1
