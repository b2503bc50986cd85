"""The state machine's table (`leasing.transitions`) and the guard that holds the code to it."""

from __future__ import annotations

import pytest

from leasing import LeaseManager, enqueue
from leasing.models import WorkItem
from tests.support import transition_guard
from tests.support.transition_guard import arranging


@pytest.mark.django_db
def test_the_guard_records_a_move_the_table_does_not_declare_and_not_an_arranged_one():
    item = enqueue("t", "noop")
    with arranging():
        WorkItem.objects.filter(pk=item.pk).update(status="completed")
    assert transition_guard.violations() == []

    other = enqueue("u", "noop")
    WorkItem.objects.filter(pk=other.pk).update(status="completed")  # pending -> completed
    assert transition_guard.violations() == [("pending -> completed", other.pk)]
    transition_guard.clear()  # or this test fails at teardown, as it should


@pytest.mark.django_db
def test_the_guard_lets_declared_moves_through():
    item = enqueue("t", "noop")
    manager = LeaseManager("w")
    manager.acquire_lease()
    manager.release_lease(item.pk, True)
    assert transition_guard.violations() == []
