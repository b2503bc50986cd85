"""A dependency that will not complete is called what it is: failed, or cancelled
(SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest

from leasing import apply_action, cancel, enqueue
from tests.support.admin import confirm, messages_of, start_action
from tests.support.helpers import row
from tests.support.items import get, run_item

pytestmark = pytest.mark.django_db


def retry(item: Any) -> Any:
    return apply_action("retry", get(item).pk, expected_token=None, actor="ops", reason="test")


def test_a_retry_refused_for_a_cancelled_dependency_says_it_was_cancelled():
    parent = enqueue("parent", "w")
    child = enqueue("child", "w", depends_on=[parent])
    cancel(parent.pk, actor="ops", reason="not needed")
    assert (row(parent.pk)["status"], row(child.pk)["status"]) == ("cancelled", "failed")
    refused = retry(child)
    assert not refused.applied
    assert refused.detail == (
        f"skipped: its dependency {parent.pk} was cancelled and it fails with its "
        "dependencies: retry that one first"
    )


def test_a_retry_refused_for_a_failed_dependency_still_says_it_failed():
    parent = enqueue("parent", "w")
    child = enqueue("child", "w", depends_on=[parent])
    run_item(parent, success=False)
    refused = retry(child)
    assert not refused.applied
    assert f"its dependency {parent.pk} failed and it fails" in refused.detail


def test_the_admins_retry_action_says_the_dependency_was_cancelled(operator_client):
    parent = enqueue("parent", "w")
    child = enqueue("child", "w", depends_on=[parent])
    cancel(parent.pk, actor="ops", reason="not needed")
    page = start_action(operator_client, "retry_failed_selected", child.pk)
    text = messages_of(confirm(operator_client, page, reason="try again"))
    assert any(f"its dependency {parent.pk} was cancelled" in m for m in text), text
    assert not any(" failed and it fails" in m for m in text), text
    assert row(child.pk)["status"] == "failed"
