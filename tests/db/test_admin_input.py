"""Bad input to the admin and /metrics: a clear error, nothing written, never a 500.

A NUL byte in an id, a filter or a selected row used to reach PostgreSQL
(`DataError`: HTTP 500); out-of-range dates in the date hierarchy and in the
confirmation page's hidden fields raised in Python. Each case here answers
with a message, a form error or a 404, on SQLite and PostgreSQL, and leaves
every table as it was.
"""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.messages.storage.fallback import FallbackStorage
from django.test import Client, RequestFactory

from leasing.models import Checkpoint, IdempotencyKey, Worker, WorkItem
from tests.support.admin import (
    FORCE,
    VIEW_ALL,
    change_url,
    changelist_url,
    dashboard_url,
    form_fields,
    lease_scenario,
    make_user,
    timeline_url,
)

pytestmark = pytest.mark.django_db

REFUSED = "characters the database cannot store"


@pytest.fixture
def scenario():
    scenario = lease_scenario()
    Worker.objects.create(worker_id="w-1", hostname="h", pid=1)
    return scenario


@pytest.fixture
def operator() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(make_user("operator", *VIEW_ALL, FORCE))
    return client


def snapshot() -> tuple:
    """Every row the admin could touch, to compare before and after."""
    return (
        sorted(WorkItem.objects.values_list("pk", "status", "lease_token", "retry_count")),
        Checkpoint.objects.count(),
        IdempotencyKey.objects.count(),
        sorted(Worker.objects.values_list("pk", "status")),
        LogEntry.objects.count(),
    )


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# --- ids in the URL ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["workitem", "checkpoint", "idempotencykey", "worker"])
@pytest.mark.parametrize("view", ["change", "history"])
def test_nul_in_an_object_url_is_an_unknown_object(scenario, operator, model, view):
    before = snapshot()
    response = operator.get(f"/admin/leasing/{model}/a%00b/{view}/", follow=True)
    assert response.status_code == 200
    assert any("doesn\u2019t exist" in m for m in messages_of(response))
    assert snapshot() == before


@pytest.mark.parametrize("task_id", ["%00", "task-healthy%00", "a%00/b"])
def test_nul_in_the_timeline_url_is_404(scenario, operator, task_id):
    before = snapshot()
    response = operator.get(f"/admin/leasing/workitem/timeline/{task_id}/")
    assert response.status_code == 404
    assert snapshot() == before


# --- the query string --------------------------------------------------------------------------


NUL_QUERIES = (
    "q=%00",
    "status__exact=%00",
    "work_type=%00",
    "queue_name=a%00",
    "lease_health=%00",
    "_changelist_filters=%00",
    "x%00y=1",
)
BAD_DATES = (
    "created_at__year=99999999999",
    "created_at__year=9999",
    "created_at__year=2024&created_at__month=2&created_at__day=30",
)


@pytest.mark.parametrize("query", NUL_QUERIES)
def test_nul_in_list_parameters_is_refused_with_a_message(scenario, operator, query):
    before = snapshot()
    response = operator.get(changelist_url(query), follow=True)
    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == changelist_url()
    assert any(REFUSED in m for m in messages_of(response))
    assert snapshot() == before


@pytest.mark.parametrize("model", ["workitem", "checkpoint", "idempotencykey"])
@pytest.mark.parametrize("query", BAD_DATES)
def test_out_of_range_dates_in_the_date_hierarchy_are_reported(scenario, operator, model, query):
    response = operator.get(f"/admin/leasing/{model}/?{query}", follow=True)
    assert response.status_code == 200
    assert any("were not valid" in m for m in messages_of(response))


def test_the_dashboard_ignores_nul_in_its_settings(scenario, operator):
    response = operator.get(dashboard_url("window=%00&refresh=1%00"))
    assert response.status_code == 200
    assert 'id="leasing-ignored"' in response.content.decode()


# --- operator actions ----------------------------------------------------------------------


@pytest.mark.parametrize("confirming", [False, True])
def test_nul_in_a_selected_id_changes_nothing(scenario, operator, confirming):
    stale = scenario.stale.work_item_id
    before = snapshot()
    data = {"action": "force_release_selected", "_selected_action": [stale, f"{stale}\x00"]}
    if confirming:
        data |= {"_leasing_confirm": "yes", "reason": "cleanup", f"token-{stale}": "1"}
    else:
        data["index"] = "0"
    response = operator.post(changelist_url(), data, follow=True)
    assert response.status_code == 200
    assert any(REFUSED in m for m in messages_of(response))
    assert snapshot() == before


def confirmation_fields(client: Client, item_id: str) -> dict[str, list[str]]:
    """The confirmation page's form for force-releasing `item_id`, as a browser would post it."""
    page = client.post(
        changelist_url(),
        {"action": "force_release_selected", "_selected_action": [item_id], "index": "0"},
    )
    return form_fields(page.content.decode(), "leasing-operator-form")


def test_nul_in_the_reason_changes_nothing(scenario, operator):
    stale = scenario.stale.work_item_id
    before = snapshot()
    fields = confirmation_fields(operator, stale)
    fields["reason"] = ["because\x00"]
    response = operator.post(changelist_url(), fields, follow=True)
    assert response.status_code == 200
    assert any(REFUSED in m for m in messages_of(response))
    assert snapshot() == before


@pytest.mark.parametrize("heartbeat", ["2024-13-45T00:00:00", "2024-02-30T10:00:00+00:00"])
def test_an_impossible_date_in_a_hidden_field_reshows_the_page(scenario, operator, heartbeat):
    stale = scenario.stale.work_item_id
    before = snapshot()
    fields = confirmation_fields(operator, stale)
    fields["reason"] = ["stuck"]
    fields[f"heartbeat-{stale}"] = [heartbeat]
    response = operator.post(changelist_url(), fields, follow=True)
    assert response.status_code == 200
    assert any("altered or is incomplete" in m for m in messages_of(response))
    assert snapshot() == before


@pytest.mark.parametrize("bad", ["\ud800", "a\udfffb"])
def test_a_lone_surrogate_in_a_selected_id_changes_nothing(scenario, bad):
    """Not reachable over HTTP (Django decodes requests with replacement); called directly."""
    stale = scenario.stale.work_item_id
    before = snapshot()
    request = RequestFactory().post(changelist_url())
    request.POST = request.POST.copy()
    request.POST.setlist("_selected_action", [stale, bad])
    request.POST.update({"action": "force_release_selected", "index": "0"})
    request.user = make_user("operator", *VIEW_ALL, FORCE)
    request.session = {}
    request._messages = FallbackStorage(request)
    request._dont_enforce_csrf_checks = True
    response = admin.site._registry[WorkItem].changelist_view(request)
    assert response.status_code == 302 and response["Location"] == changelist_url()
    assert any(REFUSED in str(m) for m in request._messages)
    assert snapshot() == before


# --- /metrics --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header", ["Bearer é", "Bearer s3cret-\u00e9", "Bearer \x00", "Bearer  ", "bearer\x00x"]
)
def test_metrics_answers_401_to_malformed_authorization(leasing_settings, header):
    leasing_settings(METRICS_TOKEN="s3cret-token")
    before = snapshot()
    response = Client(raise_request_exception=False).get(
        "/metrics?%00=%00", HTTP_AUTHORIZATION=header
    )
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert snapshot() == before


def test_metrics_with_a_non_ascii_configured_token(leasing_settings):
    leasing_settings(METRICS_TOKEN="jeton-é")
    client = Client(raise_request_exception=False)
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer jeton-x").status_code == 401
    # WSGI headers are ISO-8859-1 text: that is how a UTF-8 "é" arrives, and it matches.
    header = "Bearer " + "jeton-é".encode().decode("latin-1")
    assert client.get("/metrics", HTTP_AUTHORIZATION=header).status_code == 200


def test_change_url_of_a_real_item_still_works(scenario, operator):
    response = operator.get(change_url(scenario.ids()["healthy"]))
    assert response.status_code == 200
    assert operator.get(timeline_url("task-healthy")).status_code == 200


@pytest.mark.parametrize("model", ["workitem", "checkpoint", "idempotencykey"])
@pytest.mark.parametrize("query", ["created_at__range=", "created_at__range=2026-01-01"])
def test_a_range_without_two_ends_is_reported(scenario, operator, model, query):
    response = operator.get(f"/admin/leasing/{model}/?{query}", follow=True)
    assert response.status_code == 200
    assert any("were not valid" in m for m in messages_of(response))


def test_an_action_posted_with_a_range_without_two_ends_changes_nothing(scenario, operator):
    before = snapshot()
    response = operator.post(
        changelist_url("created_at__range="),
        {"action": "force_release_selected", "index": "0", "reason": "x"},
        follow=True,
    )
    assert response.status_code == 200
    assert snapshot() == before
