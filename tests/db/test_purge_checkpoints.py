"""Purging a finished item never takes away the resume point another item of its task
(pending or in progress) would resume from: `resume_state()` reads by task."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from leasing import LeaseManager, create_checkpoint, enqueue, resume_state
from leasing.models import Checkpoint, WorkItem
from leasing.services.retention import purge_finished_items
from tests.support.helpers import database_now
from tests.support.items import run_item

pytestmark = pytest.mark.django_db

TASK = "report:7"
MONTH = timedelta(days=30)


def attempt(item: WorkItem, *checkpoints: tuple[str, dict[str, int]]) -> None:
    """Run `item` once: write `checkpoints` under its lease, then fail it for good."""
    manager = LeaseManager("w")
    lease = manager.acquire_lease(60, task_id_filter=item.task_id)
    assert lease is not None and lease.work_item_id == item.pk
    for checkpoint_type, snapshot in checkpoints:
        create_checkpoint(item.task_id, checkpoint_type, snapshot, lease=lease)
    manager.release_lease(lease.work_item_id, success=False, error="boom")


def age(item: WorkItem) -> None:
    WorkItem.objects.filter(pk=item.pk).update(completed_at=database_now() - timedelta(days=40))


def exists(item: WorkItem) -> bool:
    return WorkItem.objects.filter(pk=item.pk).exists()


@pytest.fixture
def first_attempt() -> WorkItem:
    """An old failed item that got its task to step 3 (its resume point)."""
    first = enqueue(TASK, "report", max_retries=0)
    attempt(first, ("iteration_end", {"step": 3}), ("error_boundary", {"error": 1}))
    age(first)
    return first


def test_the_resume_point_of_a_task_enqueued_again_is_kept_until_that_item_finishes(
    first_attempt,
):
    again = enqueue(TASK, "report")  # the task enqueued again resumes from step 3

    assert purge_finished_items(MONTH, dry_run=True).items_deleted == 0
    assert purge_finished_items(MONTH).items_deleted == 0
    assert exists(first_attempt)
    assert resume_state(TASK) == {"step": 3}

    run_item(again)  # finished: nothing of the task resumes any more
    assert purge_finished_items(MONTH).items_deleted == 1
    assert not exists(first_attempt)
    assert not Checkpoint.objects.filter(task_id=TASK).exclude(work_item_id=again.pk).exists()


def test_an_item_in_progress_keeps_its_resume_point_until_it_checkpoints_past_it(first_attempt):
    again = enqueue(TASK, "report")
    manager = LeaseManager("w2")
    lease = manager.acquire_lease(60, task_id_filter=TASK)
    assert lease is not None and lease.work_item_id == again.pk
    assert resume_state(TASK) == {"step": 3}

    assert purge_finished_items(MONTH).items_deleted == 0
    assert resume_state(TASK) == {"step": 3}

    create_checkpoint(TASK, "iteration_end", {"step": 4}, lease=lease)
    assert purge_finished_items(MONTH).items_deleted == 1  # no longer the resume point
    assert resume_state(TASK) == {"step": 4}


def test_an_item_holding_no_resume_point_goes_with_its_checkpoints(first_attempt):
    """Only the resume point holds an item back, not any checkpoint of its task."""
    second = enqueue(TASK, "report", max_retries=0)
    attempt(second, ("iteration_end", {"step": 5}))
    age(second)
    enqueue(TASK, "report")  # pending: resumes from step 5, the second attempt's

    assert purge_finished_items(MONTH).items_deleted == 1
    assert not exists(first_attempt) and exists(second)
    assert not Checkpoint.objects.filter(work_item_id=first_attempt.pk).exists()
    assert resume_state(TASK) == {"step": 5}


def test_purgeitems_keeps_the_item_and_purges_it_once_nothing_resumes_from_it(first_attempt):
    again = enqueue(TASK, "report")
    other = enqueue("other", "report", max_retries=0)
    attempt(other, ("iteration_end", {"step": 1}))
    age(other)
    out = StringIO()

    call_command("purgeitems", "--older-than", "30d", stdout=out)

    assert "deleted 1 finished work item(s)" in out.getvalue()
    assert exists(first_attempt) and not exists(other)
    assert resume_state(TASK) == {"step": 3}
    run_item(again, success=False)
    call_command("purgeitems", "--older-than", "30d", "--status", "failed", stdout=out)
    assert not exists(first_attempt)
