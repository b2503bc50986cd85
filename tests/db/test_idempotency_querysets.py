"""`IdempotencyKey.objects.expired()` / `.live()` say what the engine does: a key of an
item that may run again (anything but completed) is kept past its `expires_at`."""

from __future__ import annotations

from datetime import timedelta

import pytest

from leasing import enqueue
from leasing.models import IdempotencyKey
from leasing.services.idempotency import delete_expired_keys, request_hash, run_once
from tests.support.helpers import database_now
from tests.support.items import claim, run_item

pytestmark = pytest.mark.django_db

REQUEST = request_hash("request")


@pytest.fixture
def keys() -> dict[str, str | None]:
    """Keys past their expiry naming items in every state (and two not past it)."""
    running = enqueue("running", "noop")
    assert claim("w").work_item_id == running.pk
    pending = enqueue("pending", "noop")
    done = enqueue("done", "noop")
    run_item(done)
    failed = enqueue("failed", "noop")
    run_item(failed, success=False)
    past = database_now() - timedelta(seconds=1)
    named = {
        "running": running.pk,
        "pending": pending.pk,
        "failed": failed.pk,
        "done": done.pk,
        "loose": None,
    }
    for key, item_id in named.items():
        IdempotencyKey.objects.create(
            idempotency_key=key, request_hash=REQUEST, work_item_id=item_id, expires_at=past
        )
    IdempotencyKey.objects.create(
        idempotency_key="fresh",
        request_hash=REQUEST,
        work_item_id=done.pk,
        expires_at=database_now() + timedelta(hours=1),
    )
    IdempotencyKey.objects.create(idempotency_key="forever", request_hash=REQUEST)
    return named


def names(queryset) -> set[str]:
    return set(queryset.values_list("pk", flat=True))


def test_keys_of_items_that_may_run_again_are_live_past_their_expiry(keys):
    assert names(IdempotencyKey.objects.expired()) == {"done", "loose"}
    assert names(IdempotencyKey.objects.live()) == {
        "running",
        "pending",
        "failed",
        "fresh",
        "forever",
    }


def test_expired_is_exactly_what_the_sweep_deletes_and_live_what_it_keeps(keys):
    expired = names(IdempotencyKey.objects.expired())
    live = names(IdempotencyKey.objects.live())
    assert delete_expired_keys() == len(expired)
    assert names(IdempotencyKey.objects.all()) == live
    assert not IdempotencyKey.objects.expired().exists()


def test_a_live_key_of_a_pending_item_replays_and_an_expired_one_runs_again(keys):
    """What the queryset calls live, a call finds remembered (and the reverse)."""
    IdempotencyKey.objects.filter(pk__in=["pending", "done"]).update(
        status="completed", response_data={"r": 1}
    )
    assert run_once("pending", "request", lambda: {"r": 2}, work_item=keys["pending"]) == {"r": 1}
    assert run_once("done", "request", lambda: {"r": 2}) == {"r": 2}
