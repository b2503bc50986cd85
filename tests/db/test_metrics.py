"""The Prometheus endpoint: access control and numbers computed from the database."""

from __future__ import annotations

from datetime import timedelta

import prometheus_client
import pytest
from django.db.models import Sum
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from leasing.metrics import LeasingCollector, build_registry
from leasing.models import Worker, WorkItem
from tests.support.admin import VIEW_ALL, lease_scenario, make_user, register_holders
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db

URL = "/metrics"
TOKEN = "s3cret-scrape-token"


@pytest.fixture
def token(leasing_settings) -> str:
    leasing_settings(METRICS_TOKEN=TOKEN)
    return TOKEN


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """`{(sample name, sorted labels): value}` from an exposition text."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


# --- access ------------------------------------------------------------------------------


def test_bearer_token_grants_access(token):
    response = Client().get(URL, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    assert b"leasing_work_items" in response.content
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


@pytest.mark.parametrize(
    "header", ["Bearer wrong-token", f"Bearer {TOKEN}x", "Bearer ", f"Basic {TOKEN}", "Bearer"]
)
def test_wrong_or_malformed_credentials_get_401(token, header):
    response = Client().get(URL, HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"leasing_" not in response.content


def test_a_token_is_refused_when_none_is_configured():
    response = Client().get(URL, HTTP_AUTHORIZATION="Bearer anything")
    assert response.status_code == 401


def test_anonymous_is_sent_to_the_login_page(token):
    response = Client().get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=/metrics")


def test_staff_session_is_allowed_and_other_users_are_not():
    staff = Client()
    staff.force_login(make_user("ops", *VIEW_ALL))
    assert staff.get(URL).status_code == 200
    customer = Client()
    customer.force_login(make_user("customer", staff=False))
    assert customer.get(URL).status_code == 403


def test_only_get(token):
    client = Client()
    assert client.post(URL, HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 405
    assert client.put(URL, HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 405


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete", "options"])
def test_other_methods_get_405_not_a_csrf_failure(token, method):
    """With CSRF checked, as for a real client, they used to get 403 'CSRF verification failed'."""
    client = Client(enforce_csrf_checks=True)
    response = getattr(client, method)(URL, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"
    assert b"leasing_" not in response.content


def test_head_is_allowed(token):
    response = Client().head(URL, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")


# --- the numbers ------------------------------------------------------------------------------


def test_metrics_match_the_database(token):
    lease_scenario()
    register_holders()
    now = database_now()
    Worker.objects.create(worker_id="w-1", hostname="h", pid=1, items_completed=7, items_failed=2)
    Worker.objects.create(
        worker_id="sweeper@h",
        role="sweeper",
        hostname="h",
        pid=2,
        scans=11,
        items_recovered=5,
        items_failed=1,
        last_scan_at=now,
        status="stopped",
    )
    body = Client().get(URL, HTTP_AUTHORIZATION=f"Bearer {token}").content
    values = samples(body)

    for status in ("pending", "in_progress", "completed", "failed"):
        expected = WorkItem.objects.filter(status=status).count()
        assert values[("leasing_work_items", (("status", status),))] == expected, status
    # `expired` is allowed by the table's CHECK constraint but never stored: not reported.
    assert ("leasing_work_items", (("status", "expired"),)) not in values
    assert values[("leasing_active_leases", ())] == WorkItem.objects.in_progress().count() == 4
    assert values[("leasing_stale_leases", ())] == 2
    assert values[("leasing_leases", (("health", "healthy"),))] == 2
    assert values[("leasing_leases", (("health", "stale"),))] == 1
    assert values[("leasing_leases", (("health", "expired"),))] == 1
    assert values[("leasing_leases_without_progress", ())] == 1
    assert values[("leasing_oldest_pending_age_seconds", ())] >= 0
    claims = WorkItem.objects.aggregate(total=Sum("lease_token"))["total"]
    assert values[("leasing_claims_total", ())] == claims == 6
    assert values[("leasing_completions_total", ())] == 1
    assert values[("leasing_failures_total", ())] == 3  # 2 by the worker, 1 by the sweep
    assert values[("leasing_recoveries_total", ())] == 5
    assert values[("leasing_sweep_scans_total", ())] == 11
    assert values[("leasing_sweep_last_scan_timestamp_seconds", ())] == pytest.approx(
        now.timestamp()
    )
    assert values[("leasing_processes", (("role", "worker"), ("status", "running")))] == 4
    assert values[("leasing_processes", (("role", "sweeper"), ("status", "stopped")))] == 1


def test_whether_a_sweep_runs_and_how_old_its_last_pass_is(token):
    """`leasing_sweep_running`: sweep processes running and alive, as the dashboard's
    sweepers table judges each (seen within three of its own intervals); rows of one-off
    passes are not processes. `leasing_sweep_last_scan_age_seconds`: the newest pass's
    age on the database clock."""
    client = Client()
    before = samples(client.get(URL, HTTP_AUTHORIZATION=f"Bearer {token}").content)
    assert before[("leasing_sweep_running", ())] == 0
    assert ("leasing_sweep_last_scan_age_seconds", ()) not in before  # no pass ever

    now = database_now()

    def sweeper(worker_id: str, *, seen: float, scanned: float | None, **fields) -> None:
        Worker.objects.create(
            worker_id=worker_id,
            role="sweeper",
            hostname="h",
            pid=1,
            heartbeat_interval=60,
            last_seen_at=now - timedelta(seconds=seen),
            last_scan_at=None if scanned is None else now - timedelta(seconds=scanned),
            **fields,
        )

    sweeper("sweep@a", seen=0, scanned=90)  # running, seen just now
    sweeper("sweep@b", seen=10, scanned=None, status="stopping")  # alive until it stops
    sweeper("sweep@c", seen=600, scanned=600)  # running by its row, silent for 10 min
    sweeper("sweep@d", seen=0, scanned=30, status="stopped")  # the newest pass, then stopped
    sweeper("h:once", seen=0, scanned=None)  # a `--once` pass under way: not a process
    sweeper("cron", seen=0, scanned=200, last_scan_stats={"one_off": True})
    values = samples(client.get(URL, HTTP_AUTHORIZATION=f"Bearer {token}").content)
    assert values[("leasing_sweep_running", ())] == 2
    age = values[("leasing_sweep_last_scan_age_seconds", ())]
    assert 30 <= age < 90  # sweep@d's, though it stopped (as the timestamp gauge)
    assert values[("leasing_sweep_last_scan_timestamp_seconds", ())] == pytest.approx(
        (now - timedelta(seconds=30)).timestamp()
    )

    Worker.objects.filter(status__in=["running", "stopping"]).update(status="lost")
    after = samples(client.get(URL, HTTP_AUTHORIZATION=f"Bearer {token}").content)
    assert after[("leasing_sweep_running", ())] == 0


def test_numbers_are_read_at_scrape_time(token):
    client = Client()
    first = samples(client.get(URL, HTTP_AUTHORIZATION=f"Bearer {token}").content)
    assert first[("leasing_work_items", (("status", "pending"),))] == 0
    lease_scenario()
    second = samples(client.get(URL, HTTP_AUTHORIZATION=f"Bearer {token}").content)
    assert second[("leasing_work_items", (("status", "pending"),))] == 1


def test_collector_lives_in_its_own_registry():
    registry = build_registry()
    names = {family.name for family in registry.collect()}
    assert "leasing_work_items" in names and "leasing_claims" in names
    global_names = {family.name for family in prometheus_client.REGISTRY.collect()}
    assert not {n for n in global_names if n.startswith("leasing_")}
    # Registering (describe) runs no query: the families come without samples.
    described = list(LeasingCollector().describe())
    assert described and all(not family.samples for family in described)
