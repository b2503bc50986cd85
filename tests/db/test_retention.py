"""`purgeitems`: finished items older than a cutoff go, with their checkpoints."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from leasing import LeaseManager, create_checkpoint, enqueue, enqueue_many
from leasing.exceptions import InvalidInput
from leasing.models import Checkpoint, IdempotencyKey, WorkItem
from leasing.services.retention import parse_age, purge_finished_items
from tests.support.helpers import database_now
from tests.support.items import run_item

pytestmark = pytest.mark.django_db


@pytest.fixture
def finished_items():
    items = enqueue_many([{"task_id": f"t{i}", "work_type": "w"} for i in range(6)])
    manager = LeaseManager("w")
    leases = manager.acquire_leases(5)
    for lease in leases[:3]:
        manager.release_lease(lease.id, success=True)
    manager.release_lease(leases[3].id, success=False, error="x")
    # leases[4] stays in progress, items[5] stays pending
    old = database_now() - timedelta(days=40)
    WorkItem.objects.filter(status__in=["completed", "failed"]).exclude(pk=leases[0].id).update(
        completed_at=old
    )
    WorkItem.objects.filter(pk__in=[leases[4].id, items[5].pk]).update(created_at=old)
    return items, leases


def test_purge_deletes_only_old_finished_items_and_their_checkpoints(finished_items):
    items, leases = finished_items
    create_checkpoint(leases[1].task_id, "manual_checkpoint", {"x": 1}, work_item=leases[1].id)
    IdempotencyKey.objects.create(
        idempotency_key="k", request_hash="sha256:0", work_item_id=leases[1].id
    )
    stats = purge_finished_items(timedelta(days=30), batch_size=2)
    assert stats.items_deleted == 3
    assert stats.batches == 2
    remaining = set(WorkItem.objects.values_list("pk", flat=True))
    assert remaining == {leases[0].id, leases[4].id, items[5].pk}
    assert not Checkpoint.objects.filter(work_item_id=leases[1].id).exists()
    assert IdempotencyKey.objects.get(pk="k").work_item_id is None


def test_dry_run_and_status_filter(finished_items):
    assert purge_finished_items(timedelta(days=30), dry_run=True).items_deleted == 3
    assert WorkItem.objects.count() == 6
    stats = purge_finished_items(timedelta(days=30), statuses=["failed"])
    assert stats.items_deleted == 1
    assert WorkItem.objects.failed().count() == 0


def test_command(finished_items):
    items, leases = finished_items
    out = StringIO()
    call_command("purgeitems", "--older-than", "30d", "--status", "completed", stdout=out)
    assert "deleted 2 finished work item(s)" in out.getvalue()
    # Exactly the old completed rows went; the recent one, the failed one and the
    # unfinished ones stayed.
    remaining = set(WorkItem.objects.values_list("pk", flat=True))
    assert remaining == {leases[0].id, leases[3].id, leases[4].id, items[5].pk}
    call_command("purgeitems", "--older-than", "30d", "--dry-run", stdout=out)
    assert WorkItem.objects.count() == 4
    assert "would delete 1 finished work item(s)" in out.getvalue()


@pytest.mark.parametrize(
    ("text", "seconds"), [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45", 45)]
)
def test_parse_age(text, seconds):
    assert parse_age(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("args", [["--older-than", "0d"], ["--older-than", "soon"], []])
def test_bad_options_change_nothing(finished_items, args):
    with pytest.raises(CommandError):
        call_command("purgeitems", *args)
    assert WorkItem.objects.count() == 6


def test_a_bad_status_is_refused_naming_the_choices_as_they_are_typed(finished_items):
    """It said 'choose from WorkItemStatus.COMPLETED, ...', which --status refuses."""
    with pytest.raises(CommandError) as info:
        call_command("purgeitems", "--older-than", "30d", "--status", "pending")
    assert str(info.value).endswith(
        "invalid choice: 'pending' (choose from 'completed', 'failed', 'cancelled')"
    )
    assert WorkItem.objects.count() == 6
    for status in ("completed", "failed", "cancelled"):
        call_command("purgeitems", "--older-than", "1d", "--status", status, stdout=StringIO())
    assert WorkItem.objects.count() == 3  # the old completed and failed ones went


def test_the_help_says_what_the_default_purges_and_it_does(finished_items):
    from django.core.management import load_command_class

    from leasing import cancel

    command = load_command_class("leasing", "purgeitems")
    text = " ".join(command.create_parser("manage.py", "purgeitems").format_help().split())
    assert "Delete completed, failed and cancelled work items" in text
    assert "Default: all three (completed, failed and cancelled)." in text
    items, _ = finished_items
    cancel(items[5].pk, actor="test", reason="test")
    old = database_now() - timedelta(days=40)
    WorkItem.objects.filter(pk=items[5].pk).update(completed_at=old)
    call_command("purgeitems", "--older-than", "30d", stdout=StringIO())
    assert not WorkItem.objects.filter(status__in=["failed", "cancelled"]).exists()


def test_unfinished_statuses_cannot_be_purged(finished_items):
    with pytest.raises(InvalidInput):
        purge_finished_items(timedelta(days=1), statuses=["pending"])
    assert WorkItem.objects.count() == 6


def test_a_failed_item_a_waiting_dependent_still_needs_is_not_purged(db):
    """Found by the model test: purging it left the dependent blocked forever."""
    from datetime import timedelta

    from leasing import apply_action, enqueue, waiting_on
    from leasing.services.retention import purge_finished_items
    from tests.support.helpers import database_now
    from tests.support.transition_guard import arranging

    dependency = enqueue("a", "noop")
    waiting = enqueue("b", "noop", depends_on=[dependency.pk], on_dependency_failure="wait")
    gone = enqueue("c", "noop")
    for item in (dependency, gone):
        apply_action("force_fail", item.pk, expected_token=None, actor="ops", reason="test")
    with arranging():
        WorkItem.objects.filter(pk__in=[dependency.pk, gone.pk]).update(
            completed_at=database_now() - timedelta(days=2)
        )

    stats = purge_finished_items(timedelta(hours=1), statuses=["failed"])

    assert stats.items_deleted == 1
    assert not WorkItem.objects.filter(pk=gone.pk).exists()
    assert WorkItem.objects.filter(pk=dependency.pk).exists()
    state = waiting_on(waiting.pk)
    assert (state.left, state.blocked, state.total) == (1, True, 1)
    # Once it no longer waits (it was failed by an operator), the dependency goes too.
    apply_action("force_fail", waiting.pk, expected_token=None, actor="ops", reason="test")
    assert purge_finished_items(timedelta(hours=1), statuses=["failed"]).items_deleted == 1


def test_an_item_whose_period_key_is_still_held_is_not_purged_until_its_period_ends(db):
    first = enqueue("digest-1", "w", unique_key="digest:daily", unique_while=timedelta(days=7))
    run_item(first)
    assert WorkItem.objects.get(pk=first.pk).status == "completed"
    old = database_now() - timedelta(days=2)  # finished two days ago, its key held for a week
    WorkItem.objects.filter(pk=first.pk).update(completed_at=old)

    assert purge_finished_items(timedelta(days=1), dry_run=True).items_deleted == 0
    assert purge_finished_items(timedelta(days=1)).items_deleted == 0
    again = enqueue("digest-2", "w", unique_key="digest:daily", unique_while=timedelta(days=7))
    assert again.duplicate and again.pk == first.pk  # the key still holds: no second digest

    # Its period over, the next purge takes it, and the key is free again.
    WorkItem.objects.filter(pk=first.pk).update(unique_until=database_now() - timedelta(seconds=1))
    assert purge_finished_items(timedelta(days=1)).items_deleted == 1
    fresh = enqueue("digest-3", "w", unique_key="digest:daily", unique_while=timedelta(days=7))
    assert not fresh.duplicate


def test_a_schedules_tick_is_purged_like_any_item_though_its_key_is_held_for_a_year(db):
    from datetime import UTC, datetime

    from leasing.services import schedules
    from leasing.ticks import parse_schedule

    start = datetime(2026, 1, 1, tzinfo=UTC)
    schedules.sync_from_settings(
        [parse_schedule("beat", {"work_type": "w", "every": 60})], now=start
    )
    [fired] = schedules.run_due(now=start + timedelta(seconds=61))
    tick = WorkItem.objects.get(pk=fired.work_item_id)
    assert tick.unique_scope == "period" and tick.unique_until > database_now()
    run_item(tick)
    WorkItem.objects.filter(pk=tick.pk).update(completed_at=database_now() - timedelta(days=40))

    assert purge_finished_items(timedelta(days=30), dry_run=True).items_deleted == 1
    assert purge_finished_items(timedelta(days=30)).items_deleted == 1
    assert not WorkItem.objects.filter(pk=tick.pk).exists()
