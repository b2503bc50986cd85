"""Search in payloads on the work item list (issue 42), and the one message for an ignored
filter value. Runs on SQLite and PostgreSQL (there through the GIN index of migration 0015).
"""

from __future__ import annotations

import re

import pytest
from django.db import connection

from leasing import enqueue
from tests.support.admin import FORCE, PAYLOAD, VIEW_ALL, changelist_url, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def payload_client(client):
    client.force_login(make_user("reader", *VIEW_ALL, FORCE, PAYLOAD))
    return client


@pytest.fixture
def items():
    return {
        "acme": enqueue("t-acme", "invoice", input_data={"customer": "acme", "amount": 12}).pk,
        "acme2": enqueue("t-acme2", "invoice", input_data={"customer": "acme", "amount": "12"}).pk,
        "initech": enqueue("t-initech", "invoice", input_data={"customer": "initech"}).pk,
        "nested": enqueue(
            "t-nested", "invoice", input_data={"customer": {"id": 7, "name": "acme"}}
        ).pk,
        "plain": enqueue("t-plain", "invoice", input_data=["customer", "acme"]).pk,
        "none": enqueue("t-none", "invoice").pk,
    }


def listed(html: str) -> set[str]:
    """The work item ids of the list's rows (the row checkboxes)."""
    return set(re.findall(r'name="_selected_action" value="([^"]+)"', html))


def ignored(html: str) -> list[str]:
    match = re.search(r'<div class="leasing-ignored" id="leasing-ignored".*?</div>', html, re.S)
    return re.findall(r"<li>(.*?)</li>", match.group(0)) if match else []


def test_a_key_value_filter_on_the_input_finds_exactly_the_matching_items(items, payload_client):
    html = payload_client.get(changelist_url("input__customer=acme")).content.decode()
    assert listed(html) == {items["acme"], items["acme2"]}
    assert ignored(html) == []


def test_a_number_matches_the_number_and_its_text(items, payload_client):
    html = payload_client.get(changelist_url("input__amount=12")).content.decode()
    assert listed(html) == {items["acme"], items["acme2"]}


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_value_json_cannot_hold_as_a_number_is_searched_as_text(payload_client, value):
    """Python's parser reads NaN, Infinity and 1e999; the database refused them in the
    containment query (a 500). They are text here, as a stored payload could hold."""
    as_text = enqueue("t-text", "invoice", input_data={"customer": value}).pk
    enqueue("t-other", "invoice", input_data={"customer": "acme"})
    response = payload_client.get(changelist_url(f"input__customer={value}"))
    assert response.status_code == 200
    assert listed(response.content.decode()) == {as_text}


def test_a_dotted_key_looks_inside_and_a_key_named_like_a_lookup_stays_a_key(items, payload_client):
    html = payload_client.get(changelist_url("input__customer.id=7")).content.decode()
    assert listed(html) == {items["nested"]}
    special = enqueue("t-special", "invoice", input_data={"contains": "x", "in": "y"}).pk
    html = payload_client.get(changelist_url("input__contains=x")).content.decode()
    assert listed(html) == {special}
    html = payload_client.get(changelist_url("input__in=y&input__contains=x")).content.decode()
    assert listed(html) == {special}


def test_the_form_field_and_the_output(items, payload_client):
    html = payload_client.get(changelist_url("payload=customer%3Dinitech")).content.decode()
    assert listed(html) == {items["initech"]}
    assert 'id="leasing-payload-search"' in html and 'value="customer=initech"' in html
    from leasing import LeaseManager

    lease = LeaseManager("w").acquire_lease(lease_duration_seconds=60, task_id_filter="t-none")
    LeaseManager("w").release_lease(
        lease.work_item_id, True, output_data={"receipt": "R-1"}, token=lease.token
    )
    html = payload_client.get(
        changelist_url("payload=receipt%3DR-1&payload_in=output")
    ).content.decode()
    assert listed(html) == {items["none"]}
    html = payload_client.get(changelist_url("output__receipt=R-1")).content.decode()
    assert listed(html) == {items["none"]}


def test_a_viewer_without_the_payload_permission_gets_the_whole_list_and_a_message(
    items, operator_client
):
    html = operator_client.get(changelist_url("input__customer=acme")).content.decode()
    assert listed(html) == set(items.values())  # nothing filtered: no count to infer from
    [message] = ignored(html)
    assert "payload filter" in message and "permission" in message
    assert 'id="leasing-payload-search"' not in html


@pytest.mark.parametrize(
    "query",
    [
        "payload=nokeyvalue",
        "payload=%3Dacme",
        "payload=a%3Db&payload_in=elsewhere",
        "input__=acme",
        "input__a..b=1",
        "input__a.b.c.d.e.f=1",
        "input__" + "k" * 300 + "=1",
    ],
)
def test_a_bad_payload_filter_is_ignored_with_a_message_never_a_500(items, payload_client, query):
    response = payload_client.get(changelist_url(query))
    assert response.status_code == 200
    html = response.content.decode()
    assert len(ignored(html)) == 1, ignored(html)
    assert listed(html) == set(items.values())


@pytest.mark.parametrize(
    "query,name",
    [
        ("status=zzz", "status=zzz"),
        ("status__exact=zzz", "status__exact=zzz"),
        ("lease_health=bogus", "lease_health=bogus"),
    ],
)
def test_an_unknown_filter_value_is_dropped_with_the_message_and_the_rest_applies(
    items, operator_client, query, name
):
    response = operator_client.get(changelist_url(f"{query}&work_type=invoice"))
    assert response.status_code == 200
    html = response.content.decode()
    [message] = ignored(html)
    assert message.startswith(name + ": not one of")
    assert listed(html) == set(items.values())


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the GIN index is PostgreSQL's")
def test_the_payload_search_uses_the_gin_index_on_postgresql(items):
    from leasing.admin.payload_search import PayloadFilter, apply
    from leasing.models import WorkItem

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        query = apply(WorkItem.objects.all(), [PayloadFilter("input_data", ("customer",), "x")])
        plan = query.explain()
    assert "work_items_input_path_idx" in plan, plan


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the GIN index is PostgreSQL's")
def test_the_output_search_uses_the_partial_index_of_items_with_an_output(items):
    from leasing.admin.payload_search import PayloadFilter, apply
    from leasing.models import WorkItem

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_indexdef('work_items_output_path_idx'::regclass)")
        [definition] = cursor.fetchone()
        cursor.execute("SET LOCAL enable_seqscan = off")
        query = apply(WorkItem.objects.all(), [PayloadFilter("output_data", ("receipt",), "x")])
        plan = query.explain()
    # Items without an output (every pending and running one) are not in it.
    assert definition.endswith("WHERE (output_data IS NOT NULL)"), definition
    assert "work_items_output_path_idx" in plan, plan
