"""A console page whose query PostgreSQL cancels on purpose: a 503 that says so, never a 500.

Another real session (psycopg, its transaction left open) holds an ACCESS
EXCLUSIVE lock on a table, and the session the page reads through has a
`lock_timeout` or `statement_timeout` of 200 ms, set on that very connection:
the server cancels the page's first read of the table 200 ms later, every
time (no race with a `pg_cancel_backend`). PostgreSQL only: SQLite has no such
errors. Transaction tests: the locker, the page's alias and, for the read
database, a second alias are separate sessions.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import DatabaseError, OperationalError, connections
from django.test import Client
from django.urls import reverse

from leasing.console.unreachable import Unreachable, unreachable
from leasing.models import Checkpoint, WorkItem
from tests.support.admin import (
    FORCE,
    VIEW_ALL,
    change_url,
    changelist_url,
    dashboard_url,
    make_user,
)
from tests.support.helpers import database_url, mirror_alias

REPLICA = "replica"
TIMEOUT = "200ms"
TOKEN = "metrics-token-for-tests"

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", REPLICA]),
]


@pytest.fixture(scope="module", autouse=True)
def replica_alias(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The alias `replica`: a second session on the test database (a test mirror)."""
    with mirror_alias(REPLICA, django_db_blocker):
        yield


@pytest.fixture(params=["default", REPLICA])
def page_alias(request: pytest.FixtureRequest, leasing_settings: Callable[..., None]) -> str:
    """The alias the console reads: the primary, or LEASING["READ_DATABASE"]."""
    if request.param == REPLICA:
        leasing_settings(READ_DATABASE=REPLICA)
    return str(request.param)


@contextlib.contextmanager
def cancelling(alias: str, table: str, setting: str = "lock_timeout") -> Iterator[None]:
    """`table` locked by another session; `setting` at 200 ms on the connection of `alias`."""
    import psycopg

    others = [other for other in ("default", REPLICA) if other != alias]
    locker = psycopg.connect(database_url())  # not autocommit: the lock lasts until rollback
    try:
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        with connections[alias].cursor() as cursor:
            cursor.execute(f"SET {setting} = '{TIMEOUT}'")
        for other in others:  # a read there would wait for the lock: fail instead of hanging
            with connections[other].cursor() as cursor:
                cursor.execute("SET lock_timeout = '10s'")
        yield
    finally:
        locker.rollback()
        locker.close()
        for used in (alias, *others):
            connections[used].close()  # the next session starts without the settings


def staff_client() -> Client:
    client = Client()
    client.force_login(make_user("operator", *VIEW_ALL, FORCE, superuser=True))
    return client


def assert_cancelled_page(response: Any, alias: str) -> str:
    """The 503 page of a cancelled query: the alias, the server's reason, what to do."""
    html = response.content.decode()
    assert response.status_code == 503, html[:500]
    which = "read database" if alias == REPLICA else "database"
    assert f"The {which} <code>{alias}</code> cancelled this page's query" in html
    assert re.search(
        r'data-leasing-unreachable-reason="OperationalError: canceling statement due to '
        r'(lock|statement) timeout"',
        html,
    )
    for advice in ("statement_timeout", "lock_timeout", "conflict with recovery on the replica"):
        assert advice in html
    assert "try again" in html and "raise the timeout for the console's role" in html
    assert "narrow the list's filters" in html
    assert "unreachable" not in html.split('data-leasing-unreachable-reason="')[1]
    assert "Traceback" not in html and 'File "' not in html
    assert response["Cache-Control"].startswith("max-age=0")
    return html


@pytest.mark.parametrize("setting", ["lock_timeout", "statement_timeout"])
def test_console_pages_answer_503_saying_the_query_was_cancelled(page_alias, setting):
    client = staff_client()
    item = WorkItem.objects.create(task_id="t-cancelled", work_type="noop")
    pages = {
        "dashboard": dashboard_url(),
        "list": changelist_url(),
        "filtered list": changelist_url("lease_health=stale"),
        "change page": change_url(item.pk),
    }
    with cancelling(page_alias, "work_items", setting):
        for page, url in pages.items():
            html = assert_cancelled_page(client.get(url), page_alias)
            assert "data-leasing-panel" not in html, page
        head = client.head(changelist_url())
        assert head.status_code == 503
    assert WorkItem.objects.get(pk=item.pk).status == "pending"
    assert not Checkpoint.objects.exists()


def test_metrics_answer_a_503_line_saying_the_query_was_cancelled(page_alias, leasing_settings):
    leasing_settings(METRICS_TOKEN=TOKEN)
    client = staff_client()
    scraper = Client(headers={"Authorization": f"Bearer {TOKEN}"})  # no session, no staff
    with cancelling(page_alias, "work_items"):
        answers = [client.get(reverse("leasing:metrics")), scraper.get(reverse("leasing:metrics"))]
    for response in answers:
        assert response.status_code == 503
        assert response["Content-Type"].startswith("text/plain")
        [line] = response.content.decode().splitlines()
        which = f"read database '{REPLICA}'" if page_alias == REPLICA else "database 'default'"
        assert f"The {which}" in line and "cancelled this page's query" in line
        assert "OperationalError: canceling statement due to lock timeout" in line
        assert "statement_timeout / lock_timeout / a conflict with recovery" in line
        assert "Try again" in line and "unreachable" not in line and "Traceback" not in line


def test_who_may_not_see_the_console_learns_nothing_of_it():
    outsider = Client()
    outsider.force_login(make_user("outsider", staff=False))
    with cancelling("default", "work_items"):
        # Sent to the login before the page reads anything.
        for url in (dashboard_url(), changelist_url()):
            response = outsider.get(url)
            assert response.status_code == 302 and "/login/" in response["Location"]
        assert outsider.get(reverse("leasing:metrics")).status_code == 403


def test_a_cancelled_read_of_the_session_is_a_bare_503_for_everyone():
    """The admin cannot tell who asks: staff or not, the same line, no alias, no reason."""
    clients = {"staff": staff_client(), "outsider": Client()}
    clients["outsider"].force_login(make_user("outsider", staff=False))
    with cancelling("default", "django_session"):
        for who, client in clients.items():
            response = client.get(changelist_url())
            assert response.status_code == 503, who
            assert response["Content-Type"].startswith("text/plain")
            body = response.content.decode()
            assert body == (
                "A database the admin reads cancelled this page's query; "
                "nothing was changed. Try again.\n"
            )


def test_an_operator_action_keeps_its_error():
    """A POST may have written before the cancelled statement: never "nothing was changed"."""
    client = staff_client()
    item = WorkItem.objects.create(task_id="t-post", work_type="noop")
    form = {"action": "force_release_selected", "index": "0", "_selected_action": [str(item.pk)]}
    with cancelling("default", "work_items"), pytest.raises(OperationalError):
        client.post(changelist_url(), form)


@pytest.mark.parametrize(
    "name",
    ["QueryCanceled", "LockNotAvailable", "SerializationFailure", "DeadlockDetected"],
)
def test_a_conflict_with_recovery_on_a_standby_is_a_cancellation(name):
    """What a hot standby raises for "canceling statement due to conflict with recovery"
    (40001, or 40P01 / 57014): a cancellation, for read-only pages only."""
    import psycopg.errors

    cause = getattr(psycopg.errors, name)("canceling statement due to conflict with recovery")
    try:
        raise OperationalError(str(cause)) from cause
    except DatabaseError as exc:
        reason = "OperationalError: canceling statement due to conflict with recovery"
        assert unreachable(exc, read_only=True) == Unreachable("default", reason, False, True)
        assert unreachable(exc) is None


# --- a database without leasing's tables: a 503 that says so ----------------------------------


@pytest.fixture
def replica_without_tables(leasing_settings: Callable[..., None]) -> Iterator[None]:
    """LEASING["READ_DATABASE"] reads a database that answers but has no leasing table (as
    one that is no replica of the primary): its session searches an empty schema."""
    leasing_settings(READ_DATABASE=REPLICA, METRICS_TOKEN=TOKEN)
    with connections[REPLICA].cursor() as cursor:
        cursor.execute("CREATE SCHEMA IF NOT EXISTS leasing_test_empty")
        cursor.execute("SET search_path = leasing_test_empty")
    try:
        yield
    finally:
        connections[REPLICA].close()  # the next session searches the default schema again


def test_a_read_database_without_leasing_tables_answers_503_saying_so(replica_without_tables):
    client = staff_client()
    item = WorkItem.objects.create(task_id="t-unmigrated", work_type="noop")
    for url in (dashboard_url(), changelist_url(), change_url(item.pk)):
        response = client.get(url)
        html = response.content.decode()
        assert response.status_code == 503, (url, html[:300])
        assert "data-leasing-unmigrated" in html
        assert f"The read database <code>{REPLICA}</code> lacks leasing's tables" in html
        assert "is not a replica of the primary" in html and "READ_DATABASE" in html
        assert "ProgrammingError: relation" in html and "does not exist" in html
        assert "Traceback" not in html and "is unreachable" not in html
    scrape = Client(headers={"Authorization": f"Bearer {TOKEN}"}).get(reverse("leasing:metrics"))
    assert scrape.status_code == 503
    [line] = scrape.content.decode().splitlines()
    assert f"The read database '{REPLICA}' (LEASING['READ_DATABASE']) lacks leasing's" in line
    assert "Point it at a replica of the primary ('default')" in line
    assert WorkItem.objects.get(pk=item.pk).status == "pending"  # nothing written


def test_a_missing_column_is_unmigrated_only_for_pages_that_write_nothing():
    import psycopg.errors

    cause = psycopg.errors.UndefinedColumn('column "lease_token" does not exist')
    try:
        raise DatabaseError(str(cause)) from cause
    except DatabaseError as exc:
        outage = unreachable(exc, read_only=True)
        assert outage is not None and outage.unmigrated and not outage.cancelled
        assert outage.text.endswith("Run `python manage.py migrate`.")
        assert unreachable(exc) is None  # an operator action keeps its error
