"""Property-based fuzzing of every leasing admin URL: never a 500, nothing written.

A logged-in superuser (every permission, payloads included) sends Hypothesis'
query strings, object ids and POST bodies to the change lists (filters, sort
`o=`, page `p=`, search `q=`, date hierarchy and ranges), the object pages
(change, history, delete), the console pages (dashboard, its fragment,
history, top errors, retry a group, the timeline) and the operator actions
(arbitrary selected ids, "select all" over arbitrary filters, altered
confirmation fields). Every answer is below 500, and no leasing row or admin
log entry changes: GET requests never write, and every POST here is invalid
(its reason is empty, blank, too long or unstorable), so it must not either.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasing.console.failures import error_groups
from leasing.models import Checkpoint, IdempotencyKey, Worker, WorkItem
from tests.support.admin import lease_scenario, make_user
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Any code point, NUL and lone surrogates included (sent as their UTF-8 bytes).
TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)
TRICKY = st.sampled_from(
    [
        "", " ", "0", "-1", "1", "2", "99999999999999999999", "1e309", "nan", "-0", "0x10",
        "2024", "12", "31", "0000", "9999", "10000", "99999999999", "2024-13-45", "2024-02-30",
        "9999-12-31", "0001-01-01", "2024-01-01T00:00:00", "2024-01-01 25:61",
        "pending", "in_progress", "completed", "failed", "expired", "stale", "no_progress",
        "healthy", "worker", "sweeper", "running", "lost", "error_boundary", "default",
        "send_invoice", "-created_at", "created_at", "1.2", "-1.-2", "0.0", "__", "%", "'",
        "\\", "\x00", "a\x00b", "\ud800", "x" * 10_001, "1,2", " 01HZZ ", "task-stale",
        "worker-2", "key-1", "True", "False", "yes", "on", "null",
    ]
)  # fmt: skip
VALUE = TRICKY | TEXT | st.integers(min_value=-(2**70), max_value=2**70).map(str)

LIST_KEYS = {
    "workitem": [
        "status__exact", "lease_health", "work_type", "queue_name", "created_at__year",
        "created_at__month", "created_at__day", "created_at__gte", "created_at__lt",
        "created_at__range", "status", "status__in", "retry_count__gt", "lease_holder",
        "input_data__has_key", "task_id__startswith", "task_id__regex", "status__iregex",
        "input_data__card", "lease_token__gt",
    ],
    "checkpoint": [
        "checkpoint_type__exact", "checkpoint_type", "created_at__year", "created_at__month",
        "created_at__day", "sequence_number__gte", "work_item__status", "snapshot_data__a",
        "work_item__regex", "work_item__work_item_id", "work_item", "task_id__regex",
    ],
    "idempotencykey": [
        "status__exact", "created_at__year", "created_at__month", "expires_at__lt",
        "response_data__contains", "status__regex",
    ],
    "worker": [
        "role__exact", "status__exact", "pid__gt", "last_seen_at__gte", "hostname",
        "work_types__contains", "hostname__regex",
    ],
}  # fmt: skip
COMMON_KEYS = ["o", "p", "q", "all", "e", "_changelist_filters", "_to_field", "_popup", "_facets"]
MODELS = list(LIST_KEYS)


def params(keys: list[str]) -> st.SearchStrategy[list[tuple[str, str]]]:
    """A query string's pairs: known keys (repeated or not) and arbitrary ones."""
    key = st.sampled_from(keys) | TEXT
    return st.lists(st.tuples(key, VALUE), max_size=6)


def query(pairs: list[tuple[str, str]]) -> str:
    # A real browser or proxy sends the UTF-8 bytes of whatever was typed.
    return urlencode(pairs, errors="surrogatepass")


def rows() -> tuple[Any, ...]:
    """Every row of the leasing tables and the admin log, to compare before and after."""
    return (
        sorted(WorkItem.objects.values_list(), key=repr),
        sorted(Checkpoint.objects.values_list(), key=repr),
        sorted(IdempotencyKey.objects.values_list(), key=repr),
        sorted(Worker.objects.values_list(), key=repr),
        LogEntry.objects.count(),
    )


@pytest.fixture
def scene() -> dict[str, Any]:
    scenario = lease_scenario()
    Worker.objects.create(worker_id="worker-1", hostname="host-1", pid=11, concurrency=2)
    Worker.objects.create(worker_id="sweeper@h", role="sweeper", hostname="h", pid=12)
    user = make_user("root", staff=True, superuser=True)
    client = Client(raise_request_exception=False)
    client.force_login(user)
    groups, _ = error_groups(database_now() - timedelta(days=1))
    assert groups  # the scenario's failed item: a group to retry
    return {
        "ids": scenario.ids(),
        "group_keys": [g.key for g in groups],
        "client": client,
        "before": rows(),
    }


def check(scene: dict[str, Any], response: Any, what: str) -> None:
    assert response.status_code < 500, (what, response.status_code)
    assert rows() == scene["before"], f"{what} changed rows"


def url(name: str, *args: str) -> str:
    return reverse(f"admin:{name}", args=args)


# --- change lists -------------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_change_lists_answer_any_query_string(scene, data):
    model = data.draw(st.sampled_from(MODELS))
    pairs = data.draw(params(LIST_KEYS[model] + COMMON_KEYS))
    target = f"{url(f'leasing_{model}_changelist')}?{query(pairs)}"
    check(scene, scene["client"].get(target), target)


# --- object pages -------------------------------------------------------------------------------

OBJECT_ID = (
    TEXT
    | TRICKY
    | st.sampled_from(["task-stale", "key-1", "worker-1", "1", "_5F", "_00", "a/b", "..", "_"])
)


@FUZZ
@given(
    model=st.sampled_from(MODELS),
    object_id=OBJECT_ID,
    view=st.sampled_from(["change", "history", "delete", ""]),
    pairs=params(COMMON_KEYS),
)
def test_object_pages_answer_any_id(scene, model, object_id, view, pairs):
    quoted = quote(object_id, safe="", errors="surrogatepass") or "_"
    base = url(f"leasing_{model}_changelist")
    target = f"{base}{quoted}/{view + '/' if view else ''}?{query(pairs)}"
    check(scene, scene["client"].get(target), target)


@FUZZ
@given(model=st.sampled_from(MODELS), object_id=OBJECT_ID, body=params(["_save", "csrf"]))
def test_posting_to_an_object_page_changes_nothing(scene, model, object_id, body):
    quoted = quote(object_id, safe="", errors="surrogatepass") or "_"
    for view in ("change", "delete"):
        target = f"{url(f'leasing_{model}_changelist')}{quoted}/{view}/"
        check(scene, scene["client"].post(target, query(body), content_type=FORM), target)


# --- the console pages --------------------------------------------------------------------------

CONSOLE_KEYS = ["window", "refresh", "key", "o", "p", "q", "status__exact"]


@FUZZ
@given(
    page=st.sampled_from(["dashboard", "history", "errors", "errors_retry"]),
    pairs=params(CONSOLE_KEYS),
    fragment=st.sampled_from([None, "1", "", "\x00"]) | TEXT,
)
def test_console_pages_answer_any_parameters(scene, page, pairs, fragment):
    target = f"{url(f'leasing_workitem_{page}')}?{query(pairs)}"
    headers = {} if fragment is None else {"X-Leasing-Fragment": fragment}
    check(scene, scene["client"].get(target, headers=headers), target)


@FUZZ
@given(task_id=OBJECT_ID, pairs=params(CONSOLE_KEYS))
def test_the_timeline_answers_any_task_id(scene, task_id, pairs):
    quoted = quote(task_id, safe="", errors="surrogatepass")
    target = f"{url('leasing_workitem_changelist')}timeline/{quoted}/?{query(pairs)}"
    check(scene, scene["client"].get(target), target)


# --- POSTs: operator actions, bulk selections, group retries -----------------------------------

FORM = "application/x-www-form-urlencoded"
# Never a valid reason, so no POST here may change anything.
BAD_REASON = st.sampled_from(["", " ", "\n\t ", "r" * 1001, "why\x00"])


@st.composite
def action_body(draw: Any, ids: list[str]) -> list[tuple[str, str]]:
    selected = draw(st.lists(st.sampled_from(ids) | TEXT | TRICKY, max_size=4))
    body = [
        ("action", draw(st.sampled_from(ACTIONS) | TEXT)),
        ("index", draw(st.sampled_from(["0", "1", "-1", ""]) | TEXT)),
        *(("_selected_action", pk) for pk in selected),
    ]
    optional = {
        "select_across": st.sampled_from(["0", "1", "True"]) | TEXT,
        "_leasing_confirm": st.sampled_from(["yes", "no"]) | TEXT,
        "_leasing_bulk": st.sampled_from(["yes"]) | TEXT,
        "expected": VALUE,
        "_leasing_return_to": st.sampled_from(["/admin/", "https://evil.example/", "//x"]) | TEXT,
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            body.append((name, draw(strategy)))
    for pk in selected[:2]:
        if draw(st.booleans()):
            body.append((f"token-{pk}", draw(VALUE)))
        if draw(st.booleans()):
            body.append((f"heartbeat-{pk}", draw(VALUE)))
    body.append(("reason", draw(BAD_REASON)))
    return body


ACTIONS = ["force_release_selected", "force_fail_selected", "retry_failed_selected", "delete"]


@FUZZ
@given(data=st.data())
def test_invalid_action_posts_change_nothing(scene, data):
    body = data.draw(action_body(list(scene["ids"].values())))
    filters = data.draw(params(LIST_KEYS["workitem"] + COMMON_KEYS))
    target = f"{url('leasing_workitem_changelist')}?{query(filters)}"
    response = scene["client"].post(target, query(body), content_type=FORM)
    check(scene, response, f"POST {target} {body!r}")


@FUZZ
@given(
    data=st.data(),
    pairs=params(["key", "window"]),
    body=st.lists(
        st.tuples(st.sampled_from(["_leasing_bulk", "expected", "reason"]) | TEXT, VALUE),
        max_size=4,
    ),
    reason=BAD_REASON,
)
def test_invalid_group_retries_change_nothing(scene, data, pairs, body, reason):
    if data.draw(st.booleans()):
        pairs = [("key", data.draw(st.sampled_from(scene["group_keys"]))), *pairs[:1]]
    target = f"{url('leasing_workitem_errors_retry')}?{query(pairs)}"
    payload = query([*body, ("_leasing_bulk", "yes"), ("reason", reason)])
    check(scene, scene["client"].post(target, payload, content_type=FORM), target)


# --- what the fuzz found ------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_an_empty_to_field_opens_the_object_page(scene, model):
    """`?_to_field=` (empty) made Django look up the field '' (FieldDoesNotExist: a 500)."""
    object_id = {
        "workitem": scene["ids"]["failed"],
        "checkpoint": str(Checkpoint.objects.values_list("pk", flat=True).first()),
        "idempotencykey": "key-1",
        "worker": "worker-1",
    }[model]
    target = url(f"leasing_{model}_change", object_id) + "?_to_field="
    response = scene["client"].get(target)
    assert response.status_code == 200
    assert object_id in response.content.decode()
    check(scene, response, target)


@pytest.mark.parametrize(
    ("model", "lookup"),
    [
        ("workitem", "task_id__regex=("),  # a database error: invalid pattern
        ("workitem", "status__iregex=*"),
        ("checkpoint", "work_item__regex=["),
        ("idempotencykey", "response_data__contains="),  # no JSON contains on SQLite
        ("worker", "work_types__contains=x"),
        ("workitem", "input_data__card=S3CRET"),  # probing a payload by result counts
        ("workitem", "task_id__icontains=task"),  # a scan of every row
    ],
)
def test_lookups_no_list_offers_are_refused(scene, model, lookup):
    response = scene["client"].get(f"{url(f'leasing_{model}_changelist')}?{lookup}")
    assert response.status_code == 400
    check(scene, response, lookup)


@pytest.mark.parametrize(
    ("model", "query"),
    [
        ("workitem", "status__exact=failed&work_type=noop&queue_name=default"),
        ("workitem", "lease_health=stale&created_at__year=2026"),
        ("workitem", "retry_count__gte=0&lease_token__in=1,2&run_after__isnull=True"),
        ("checkpoint", "checkpoint_type__exact=error_boundary&work_item__work_item_id=x"),
        ("worker", "role__exact=worker&status__exact=running"),
    ],
)
def test_the_lookups_of_filters_and_links_still_work(scene, model, query):
    response = scene["client"].get(f"{url(f'leasing_{model}_changelist')}?{query}")
    assert response.status_code == 200
    assert b"errornote" not in response.content
