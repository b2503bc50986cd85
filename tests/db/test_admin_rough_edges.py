"""Issue 42's rough edges: one message for an ignored value on every console page, times
to the second, one number format. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import re

import pytest
from django.template import Context, Template
from django.urls import reverse

from tests.support.admin import change_url

pytestmark = pytest.mark.django_db

SECONDS = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def test_every_time_of_the_item_page_and_the_list_has_seconds(scenario, operator_client):
    item_id = scenario.ids()["healthy"]
    html = operator_client.get(change_url(item_id)).content.decode()
    for field in ("created", "lease_acquired", "lease_expires", "heartbeat", "started"):
        block = re.search(rf'<div class="[^"]*field-{field}\b.*?</div>\s*</div>', html, re.S)
        assert block and re.search(SECONDS, block.group(0)), (field, block and block.group(0))
    listed = operator_client.get(reverse("admin:leasing_workitem_changelist")).content.decode()
    cells = re.findall(r'<td class="field-created[^"]*">(.*?)</td>', listed)
    assert cells and all(re.fullmatch(SECONDS, c) for c in cells), cells
    for model, column in (("checkpoint", "created"), ("idempotencykey", "created")):
        listed = operator_client.get(reverse(f"admin:leasing_{model}_changelist")).content
        cells = re.findall(rf'<td class="field-{column}[^"]*">(.*?)</td>', listed.decode())
        assert cells and all(re.fullmatch(SECONDS, c) for c in cells), (model, cells)


@pytest.mark.parametrize(
    "page,query",
    [
        ("dashboard", "window=7"),
        ("errors", "window=bogus"),
        ("history", "window=99"),
        ("changelist", "status=zzz"),
        ("changelist", "lease_health=bogus"),
    ],
)
def test_a_bad_value_is_named_in_the_same_element_on_every_page(
    scenario, operator_client, page, query
):
    url = reverse(f"admin:leasing_workitem_{page}") + "?" + query
    response = operator_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    element = re.search(
        r'<div class="leasing-ignored" id="leasing-ignored" role="status">.*?</div>', html, re.S
    )
    assert element is not None, html[:2000]
    assert query in element.group(0)


def test_one_number_format():
    rendered = Template("{% load leasing_console %}{{ a|number }} {{ b|number }} {{ c|number }}")
    assert rendered.render(Context({"a": 999894, "b": 8000, "c": None})) == "999,894 8,000 —"


def test_the_dashboard_counts_in_the_one_number_format(operator_client):
    from leasing import enqueue_many

    enqueue_many(
        [{"task_id": f"t{i}", "queue_name": "bulk", "work_type": "test.noop"} for i in range(1234)]
    )
    html = operator_client.get(reverse("admin:leasing_workitem_dashboard")).content.decode()
    statuses = re.search(r'id="leasing-statuses".*?</section>', html, re.S)
    queues = re.search(r'id="leasing-queues".*?</section>', html, re.S)
    assert statuses and "1,234" in statuses.group(0) and "1234" not in statuses.group(0)
    assert queues and ">1,234</a>" in queues.group(0)
