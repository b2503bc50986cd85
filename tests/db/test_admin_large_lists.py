"""The work item list on tables of millions of rows: bounded pages, indexed sorts only.

The limits are lowered here so a handful of rows exercises them; `make
bench-dashboard` times the real thing at 1,000,000 rows.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from leasing import enqueue
from leasing.admin.options import WorkItemAdmin
from leasing.admin.paginator import EstimatedCountPaginator
from leasing.models import WorkItem
from tests.support.admin import changelist_url
from tests.support.helpers import database_now
from tests.support.transition_guard import arranging

pytestmark = pytest.mark.django_db


@pytest.fixture
def eight_items() -> list[str]:
    """Eight pending items, newest first (the list's default order)."""
    ids = [enqueue(f"task-page-{n}", "noop").pk for n in range(8)]
    return list(reversed(ids))


def test_a_page_past_the_cap_serves_the_last_offered_page_and_says_why(
    monkeypatch, viewer_client, eight_items
):
    monkeypatch.setattr(EstimatedCountPaginator, "max_pages", 2)
    monkeypatch.setattr(WorkItemAdmin, "list_per_page", 2)
    response = viewer_client.get(changelist_url("p=4"))
    assert response.status_code == 200
    cl = response.context["cl"]
    assert cl.paginator.num_pages == 2 and cl.paginator.is_capped
    assert cl.page_num == 2
    assert [item.pk for item in cl.result_list] == eight_items[2:4]
    html = response.content.decode()
    assert "pages past 2 are not offered" in html
    assert "p=3" not in html  # no link to a page that is not served
    # A huge page number is clamped too, never a 500 or the `?e=1` redirect.
    response = viewer_client.get(changelist_url("p=99999999999999999999"))
    assert response.status_code == 200 and response.context["cl"].page_num == 2


def test_a_list_within_the_cap_offers_every_page_and_no_note(
    monkeypatch, viewer_client, eight_items
):
    monkeypatch.setattr(WorkItemAdmin, "list_per_page", 2)
    response = viewer_client.get(changelist_url("p=4"))
    cl = response.context["cl"]
    assert cl.paginator.num_pages == 4 and not cl.paginator.is_capped
    assert [item.pk for item in cl.result_list] == eight_items[6:8]
    assert "are not offered" not in response.content.decode()


def test_only_indexed_columns_are_sortable_and_a_forged_sort_keeps_the_default_order(
    viewer_client, eight_items
):
    response = viewer_client.get(changelist_url())
    cl = response.context["cl"]
    assert set(cl.sortable_by) == {"work_item_id", "created"}
    status_column = cl.list_display.index("status_badge")
    html = response.content.decode()
    assert f"o={status_column}" not in html  # no header link sorts by status
    forged = viewer_client.get(changelist_url(f"o={status_column}"))
    assert forged.status_code == 200
    assert [item.pk for item in forged.context["cl"].result_list] == eight_items


@pytest.mark.postgres  # SQLite counts exactly, so its date hierarchy is Django's own
def test_date_hierarchy_of_an_estimated_filtered_list_spans_the_whole_table(
    monkeypatch, viewer_client, eight_items
):
    # The bounds of the filtered rows would need a walk of the index past every
    # row the filter rejects; the table's own bounds are two index lookups.
    old = enqueue("task-old", "noop")
    a_year_ago = database_now() - timedelta(days=400)
    with arranging():
        WorkItem.objects.filter(pk=old.pk).update(status="completed", created_at=a_year_ago)
    monkeypatch.setattr(EstimatedCountPaginator, "exact_limit", 5)
    response = viewer_client.get(changelist_url("status__exact=pending"))
    cl = response.context["cl"]
    assert cl.paginator.is_estimate
    html = response.content.decode()
    this_year = database_now().year
    assert f"created_at__year={a_year_ago.year}" in html
    assert f"created_at__year={this_year}" in html


def test_date_hierarchy_of_a_counted_list_spans_only_its_rows(viewer_client, eight_items):
    old = enqueue("task-old", "noop")
    a_year_ago = database_now() - timedelta(days=400)
    with arranging():
        WorkItem.objects.filter(pk=old.pk).update(status="completed", created_at=a_year_ago)
    html = viewer_client.get(changelist_url("status__exact=pending")).content.decode()
    assert f"created_at__year={a_year_ago.year}" not in html
    today = database_now()
    # All eight pending items are from today: the hierarchy goes down to its day.
    assert f"created_at__day={today.day}" in html
    everything = viewer_client.get(changelist_url()).content.decode()
    assert f"created_at__year={a_year_ago.year}" in everything


def test_date_hierarchy_of_a_long_exactly_counted_list_spans_all_its_rows(
    monkeypatch, viewer_client, eight_items
):
    # SQLite counts every list exactly; past the exact limit its bounds must
    # still come from every row, not from the first `exact_limit` ones.
    old = enqueue("zz-old", "noop")  # last by insertion and by task id: outside the first rows
    a_year_ago = database_now() - timedelta(days=400)
    WorkItem.objects.filter(pk=old.pk).update(created_at=a_year_ago)
    monkeypatch.setattr(EstimatedCountPaginator, "exact_limit", 3)
    html = viewer_client.get(changelist_url("status__exact=pending")).content.decode()
    assert f"created_at__year={a_year_ago.year}" in html
    assert f"created_at__year={database_now().year}" in html
