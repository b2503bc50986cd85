"""The dashboard's fair queues panel and the work item list's `fairness_key` filter."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from leasing import enqueue_many
from leasing.console.fairness import claimable_by_key
from leasing.sql.runner import database_now

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/leasing/workitem/dashboard/"
LIST = "/admin/leasing/workitem/"


def backlog(key: str | None, n: int, *, queue: str = "fair", **fields) -> None:
    later = "-later" if "run_after" in fields else ""
    enqueue_many(
        [
            {
                "task_id": f"{queue}-{key}-{i}{later}",
                "work_type": "test.noop",
                "queue_name": queue,
                "fairness_key": key,
                **fields,
            }
            for i in range(n)
        ]
    )


def key_rows(html: str) -> list[tuple[str, str, int, int]]:
    """(queue, key, pending, weight) of each key row of the fair queues panel, in order."""
    return [
        (queue, key, int(pending), int(weight))
        for queue, key, pending, weight in re.findall(
            r'data-queue="([^"]*)" data-fairness-key="([^"]*)">.*?data-pending="(\d+)".*?'
            r'data-weight="(\d+)"',
            html,
            re.S,
        )
    ]


def test_the_panel_lists_each_key_with_its_claimable_count_and_weight(
    leasing_settings, admin_client
):
    leasing_settings(FAIR_QUEUES=["fair"], FAIRNESS_WEIGHTS={"premium": 3})
    backlog("premium", 5)
    backlog("basic", 2)
    backlog("trial", 1)
    backlog("trial", 4, run_after=timezone.now() + timedelta(hours=1))  # not due: not claimable
    backlog(None, 3)  # no key: not a key's row
    backlog("elsewhere", 6, queue="plain")  # not a fair queue
    page = admin_client.get(DASHBOARD)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="leasing-fairness"' in html
    assert key_rows(html) == [
        ("fair", "premium", 5, 3),
        ("fair", "basic", 2, 1),
        ("fair", "trial", 1, 1),
    ]
    assert 'data-keys="3"' in html
    # The list of the key's unblocked pending items: the condition of work_items_fair_idx,
    # so the list reads the key's entries instead of the whole table.
    assert "fairness_key=basic&amp;status__exact=pending&amp;dependencies_left=0" in html


def test_the_panel_is_absent_without_fair_queues(admin_client):
    backlog("premium", 2)
    page = admin_client.get(DASHBOARD)
    assert page.status_code == 200
    assert 'id="leasing-fairness"' not in page.content.decode()


def test_a_fair_queue_without_claimable_keys_says_so(leasing_settings, admin_client):
    leasing_settings(FAIR_QUEUES=["fair"])
    html = admin_client.get(DASHBOARD).content.decode()
    assert key_rows(html) == []
    assert "no key has a claimable item" in html


def test_the_panel_lists_at_most_ten_keys_of_a_queue_the_most_pending_first(
    leasing_settings, admin_client
):
    leasing_settings(FAIR_QUEUES=["fair"])
    for i in range(12):
        backlog(f"k{i:02}", i + 1)
    html = admin_client.get(DASHBOARD).content.decode()
    rows = key_rows(html)
    assert [key for _, key, _, _ in rows] == [f"k{i:02}" for i in range(11, 1, -1)]
    assert 'data-keys="12"' in html


def test_a_key_s_link_lists_that_key_s_items_only(admin_client):
    backlog("basic", 2)
    backlog("premium", 1)
    html = admin_client.get(LIST, {"fairness_key": "basic"}).content.decode()
    assert "fair-basic-0" in html and "fair-basic-1" in html
    assert "fair-premium-0" not in html


def test_a_fairness_key_the_database_cannot_store_is_refused_not_a_500(admin_client):
    page = admin_client.get(LIST, {"fairness_key": "a\x00b"})
    assert page.status_code in (200, 302)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plans")
def test_the_panel_reads_the_fair_index_not_the_table(leasing_settings):
    backlog("a", 3000, queue="plain")
    backlog("a", 20)
    backlog("b", 5)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE work_items")
    plan = claimable_by_key(["fair"], now=database_now("default")).explain()
    assert "Seq Scan on work_items" not in plan, plan
    assert "work_items_fair_idx" in plan, plan
