"""`LEASING["READ_DATABASE"]`: the console reads from another alias, leases stay on the primary.

A second alias, `replica`, points at the test database itself (a test mirror
of `default`), so every page works and the queries each alias receives tell
where a page read from: the console's pages and `/metrics` read the leasing
tables only through `replica`; an operator action reads what it fences on,
and writes, only through `default`. Runs on SQLite and PostgreSQL (the
replica connection is a second session, so these tests commit: transaction
tests). A real streaming replica, behind and paused, is tests/ha/test_replica.py.
"""

from __future__ import annotations

import copy
import re
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from django.test import Client
from django.urls import reverse

from leasing.console.replica import replica_lag
from leasing.models import Checkpoint, WorkItem
from leasing.services import processes
from tests.support.admin import (
    FORCE,
    VIEW_ALL,
    change_url,
    changelist_url,
    dashboard_url,
    form_fields,
    lease_scenario,
    make_user,
    register_holders,
    timeline_url,
)
from tests.support.helpers import mirror_alias
from tests.support.queries import Seen

REPLICA = "replica"

both_databases = pytest.mark.django_db(transaction=True, databases=["default", REPLICA])


@pytest.fixture(scope="module", autouse=True)
def replica_alias(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The alias `replica`: a second session on the test database (a test mirror)."""
    with mirror_alias(REPLICA, django_db_blocker):
        yield


@pytest.fixture
def read_from_replica(leasing_settings: Callable[..., None]) -> None:
    leasing_settings(READ_DATABASE=REPLICA)


def client_with(*perms: str, name: str = "operator") -> Client:
    client = Client()
    client.force_login(make_user(name, *perms, superuser=True))
    return client


# --- the setting and its check --------------------------------------------------------------


# --- the console reads the replica ----------------------------------------------------------


@both_databases
def test_console_pages_read_only_the_replica(read_from_replica):
    scenario = lease_scenario()
    client = client_with(*VIEW_ALL)
    worker = "worker-1"
    pages = {
        "dashboard": dashboard_url(),
        "list": changelist_url(),
        "filtered list": changelist_url("lease_health=stale&work_type=resize_image"),
        "change page": change_url(scenario.healthy.work_item_id),
        "timeline": timeline_url("task-healthy"),
        "history": reverse("admin:leasing_workitem_history"),
        "errors": reverse("admin:leasing_workitem_errors"),
        "checkpoints": reverse("admin:leasing_checkpoint_changelist"),
        "idempotency keys": reverse("admin:leasing_idempotencykey_changelist"),
        "idempotency key": reverse("admin:leasing_idempotencykey_change", args=["key-1"]),
        "workers": reverse("admin:leasing_worker_changelist"),
        "metrics": reverse("leasing:metrics"),
    }
    processes.register(worker, heartbeat_interval=30)
    pages["worker page"] = reverse("admin:leasing_worker_change", args=[worker])
    for page, url in pages.items():
        with Seen() as seen:
            response = client.get(url)
        assert response.status_code == 200, page
        assert seen.read(REPLICA), f"{page} read no leasing table from the replica"
        assert not seen.read("default"), f"{page} read {seen.read('default')} from the primary"


@both_databases
def test_without_the_setting_the_console_reads_the_default_database():
    lease_scenario()
    client = client_with(*VIEW_ALL)
    for url in (dashboard_url(), changelist_url(), reverse("leasing:metrics")):
        with Seen() as seen:
            assert client.get(url).status_code == 200
        assert seen.read("default") and not seen.read(REPLICA)


@both_databases
def test_dashboard_and_metrics_say_how_far_behind_the_read_database_is(read_from_replica, vendor):
    client = client_with(*VIEW_ALL)
    html = client.get(dashboard_url()).content.decode()
    assert 'data-replica-alias="replica"' in html
    # The test "replica" is the primary itself: not PostgreSQL (SQLite) or not
    # in recovery (PostgreSQL); either way the page says so instead of failing.
    expected = "not PostgreSQL: lag not measured" if vendor == "sqlite" else "not a replica: no lag"
    assert f"replication lag read database &#x27;replica&#x27; is {expected}" in html
    metrics = client.get(reverse("leasing:metrics")).content.decode()
    assert "# TYPE leasing_read_replica_lag_seconds gauge" in metrics
    assert not re.search(r"^leasing_read_replica_lag_seconds ", metrics, re.MULTILINE)


@both_databases
def test_no_lag_line_when_the_console_reads_the_primary():
    html = client_with(*VIEW_ALL).get(dashboard_url()).content.decode()
    assert "leasing-replica-lag" not in html


@pytest.mark.postgres
@both_databases
def test_lag_of_a_database_that_is_not_a_replica_is_zero_on_postgres():
    lag = replica_lag(REPLICA, primary="default")
    assert lag.measured and not lag.is_replica
    assert (lag.seconds, lag.bytes, lag.paused) == (0.0, 0, False)


# --- operator actions decide and write on the primary ---------------------------------------


@both_databases
def test_force_release_reads_its_lease_and_writes_on_the_primary(read_from_replica):
    scenario = lease_scenario()
    client = client_with(*VIEW_ALL, FORCE)
    item = scenario.stale.work_item_id
    ask = {"action": "force_release_selected", "_selected_action": [item], "index": "0"}
    with Seen() as shown:
        page = client.post(changelist_url(), ask)
    assert page.status_code == 200
    # The item and the token the confirmation carries come from the primary.
    assert "work_items" in shown.read("default")
    assert not shown.written(REPLICA) and not shown.written("default")
    fields = form_fields(page.content.decode(), "leasing-operator-form")
    fields["reason"] = ["replica test"]
    with Seen() as confirmed:
        done = client.post(changelist_url(), fields, follow=True)
    assert "1 work item force-released." in [str(m) for m in done.context["messages"]]
    assert {"work_items", "checkpoints"} <= confirmed.written("default")
    assert not confirmed.written(REPLICA)
    assert WorkItem.objects.get(pk=item).status == "pending"


@both_databases
def test_select_all_counts_on_the_replica_and_acts_on_what_the_primary_matches(
    read_from_replica,
):
    scenario = lease_scenario()
    register_holders()
    client = client_with(*VIEW_ALL, FORCE)
    select_all = {
        "action": "force_release_selected",
        "_selected_action": [scenario.stale.work_item_id],
        "select_across": "1",
        "index": "0",
    }
    url = changelist_url("lease_health=stale")
    with Seen() as shown:
        page = client.post(url, select_all)
    html = page.content.decode()
    assert "<strong>1 work item</strong> matches now" in html
    assert "work_items" in shown.read(REPLICA)
    assert not shown.read("default")  # the confirmation count alone: replica

    fields = form_fields(html, "leasing-bulk-form")
    fields["reason"] = ["replica test"]
    with Seen() as confirmed:
        client.post(url, fields, follow=True)
    # Confirming evaluates the filter again, and reads the fences, on the primary.
    default_sql = [q["sql"] for q in confirmed.captures["default"].captured_queries]
    assert any("lease_token" in sql and "work_items" in sql for sql in default_sql)
    assert {"work_items", "checkpoints"} <= confirmed.written("default")
    assert not confirmed.written(REPLICA)
    assert WorkItem.objects.get(pk=scenario.stale.work_item_id).status == "pending"


@both_databases
def test_retrying_an_error_group_confirms_on_the_replica_and_acts_on_the_primary(
    read_from_replica,
):
    scenario = lease_scenario()
    client = client_with(*VIEW_ALL, FORCE)
    with Seen() as listed:
        errors = client.get(reverse("admin:leasing_workitem_errors")).content.decode()
    assert not listed.read("default")
    retry_url = re.search(r'href="([^"]*errors/retry/\?[^"]*)"', errors).group(1)
    retry_url = retry_url.replace("&amp;", "&")
    with Seen() as shown:
        page = client.get(retry_url)
    assert page.status_code == 200
    assert "work_items" in shown.read(REPLICA) and not shown.read("default")
    fields = form_fields(page.content.decode(), "leasing-bulk-form")
    fields["reason"] = ["replica test"]
    with Seen() as confirmed:
        done = client.post(retry_url, fields)
    assert done.status_code == 302  # back to the errors page (which reads the replica)
    assert "work_items" in confirmed.read("default")
    assert not confirmed.read(REPLICA) and not confirmed.written(REPLICA)
    assert WorkItem.objects.get(pk=scenario.failed).status == "pending"
    assert Checkpoint.objects.filter(
        work_item_id=scenario.failed, checkpoint_type="state_transition"
    ).exists()


# --- an unreachable read database: a 503 that says so, never a 500 ----------------------------

DOWN = "down"
# On PostgreSQL a port nothing listens on; on SQLite a file that cannot be opened.
SQLITE_UNOPENABLE = "/nonexistent/leasing-read-database/replica.sqlite3"

down_declared = pytest.mark.django_db(transaction=True, databases=["default", DOWN])


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound once, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="class")
def down_alias(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """`DATABASES["down"]`: an entry whose server never answers, for one class of tests.

    A test mirror of `default` to Django's test case (which then neither flushes
    it nor opens a transaction on it); other tests of the module never see it
    (`Seen` connects to every alias).
    """
    settings_dict = copy.deepcopy(connections["default"].settings_dict)
    settings_dict["TEST"] = {**settings_dict.get("TEST", {}), "MIRROR": "default"}
    if settings_dict["ENGINE"].endswith("sqlite3"):
        settings_dict["NAME"] = SQLITE_UNOPENABLE
    else:
        settings_dict |= {"HOST": "127.0.0.1", "PORT": str(closed_port())}
        settings_dict["OPTIONS"] = {**settings_dict.get("OPTIONS", {}), "connect_timeout": 3}
    connections.settings[DOWN] = settings_dict
    try:
        yield DOWN
    finally:
        with django_db_blocker.unblock():
            connections[DOWN].close()
        del connections[DOWN]
        del connections.settings[DOWN]


def assert_unreachable_page(response: Any, alias: str = DOWN) -> str:
    """A 503 naming the alias and the driver's reason in one line, with no traceback."""
    html = response.content.decode()
    assert response.status_code == 503, html[:500]
    assert f"The read database <code>{alias}</code> is unreachable" in html
    assert re.search(r'data-leasing-unreachable-reason="OperationalError: [^"\n]+"', html)
    assert "READ_DATABASE" in html  # what the operator can do
    assert "Traceback" not in html and 'File "' not in html
    assert response["Cache-Control"].startswith("max-age=0")
    return html


@down_declared
class TestUnreachableReadDatabase:
    @pytest.fixture(autouse=True)
    def read_from_down(self, down_alias: str, leasing_settings: Callable[..., None]) -> None:
        leasing_settings(READ_DATABASE=down_alias)

    def test_console_pages_answer_503_and_write_nothing(self):
        client = client_with(*VIEW_ALL)
        item = WorkItem.objects.create(task_id="t-down", work_type="noop")  # on the primary
        pages = {
            "dashboard": dashboard_url(),
            "list": changelist_url(),
            "filtered list": changelist_url("lease_health=stale"),
            "change page": change_url(item.pk),
            "item history": reverse("admin:leasing_workitem_history", args=[item.pk]),
            "timeline": timeline_url("t-down"),
            "history": reverse("admin:leasing_workitem_history"),
            "errors": reverse("admin:leasing_workitem_errors"),
            "retry a group": reverse("admin:leasing_workitem_errors_retry") + f"?key={'0' * 16}",
            "checkpoints": reverse("admin:leasing_checkpoint_changelist"),
            "checkpoint": reverse("admin:leasing_checkpoint_change", args=["1"]),
            "idempotency keys": reverse("admin:leasing_idempotencykey_changelist"),
            "idempotency key": reverse("admin:leasing_idempotencykey_change", args=["key-1"]),
            "workers": reverse("admin:leasing_worker_changelist"),
            "worker page": reverse("admin:leasing_worker_change", args=["w-down"]),
        }
        for page, url in pages.items():
            response = client.get(url)
            assert response.status_code == 503, page
            assert_unreachable_page(response)
        assert WorkItem.objects.get(pk=item.pk).status == "pending"
        assert not Checkpoint.objects.exists()
        # Who may not see the console never sees the alias or the reason either.
        anonymous = Client().get(dashboard_url())
        assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
        outsider = Client()
        outsider.force_login(make_user("outsider", staff=False))
        assert outsider.get(dashboard_url()).status_code == 302

    def test_the_live_refresh_gets_a_503_and_keeps_its_panels(self):
        # console.js answers any status but 2xx with "refresh failed (HTTP 503); retrying"
        # and leaves the panels it shows: never a state fresher than the database's.
        response = client_with(*VIEW_ALL).get(dashboard_url(), HTTP_X_LEASING_FRAGMENT="1")
        assert "data-leasing-panel" not in assert_unreachable_page(response)

    def test_metrics_answer_503_in_one_line(self):
        response = client_with(*VIEW_ALL).get(reverse("leasing:metrics"))
        assert response.status_code == 503
        assert response["Content-Type"].startswith("text/plain")
        [line] = response.content.decode().splitlines()
        assert f"read database '{DOWN}'" in line and "unreachable" in line
        assert "OperationalError: " in line and "Traceback" not in line
