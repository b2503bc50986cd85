"""A pending idempotency key's run is (item, token): the lease it was claimed under,
not whatever lease of the item was acquired no later than the key."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from leasing import LeaseLostError, apply_action, enqueue
from leasing.exceptions import IdempotencyInProgress
from leasing.models import IdempotencyKey, WorkItem
from leasing.services.idempotency import run_once
from tests.support.items import claim, context

pytestmark = pytest.mark.django_db


def key_row(key: str) -> dict[str, Any]:
    return IdempotencyKey.objects.filter(pk=key).values().get()


def lease_acquired_as_the_key(item_id: str, key: str) -> None:
    """Give the item's lease the key's claim time, to the stored digit: a claim in
    the key's own instant (on SQLite's millisecond clock, a retry that fast)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE work_items SET lease_acquired_at = "
            "(SELECT created_at FROM idempotency_keys WHERE idempotency_key = %s) "
            "WHERE work_item_id = %s",
            [key, item_id],
        )


def a_dead_attempts_pending_key(key: str) -> str:
    """An attempt claims `key` under its lease and loses the lease while its effect
    runs (as if it crashed): the key stays pending under that lease's token."""
    item = enqueue("job", "noop")
    dead = context(claim("dead"))

    def lose_the_lease() -> None:
        result = apply_action(
            "force_release", item.pk, expected_token=None, actor="ops", reason="test"
        )
        assert result.applied, result.detail

    with pytest.raises(LeaseLostError):
        dead.run_once(key, {"n": 1}, lose_the_lease)
    assert key_row(key)["status"] == "pending"
    return item.pk


def test_a_retry_claimed_in_the_instant_of_the_dead_attempts_key_takes_it_over_at_once():
    """Judged by time, the dead attempt still owned the key (its lease acquired
    no later than the key): the retry lost an attempt waiting for nobody."""
    item_id = a_dead_attempts_pending_key("charge")
    retry = context(claim("retry"))
    assert retry.lease.work_item_id == item_id
    lease_acquired_as_the_key(item_id, "charge")

    def meanwhile() -> str:
        # The key is now the retry's own: another caller finds its run alive.
        with pytest.raises(IdempotencyInProgress):
            run_once("charge", {"n": 1}, lambda: "twice", work_item=item_id)
        return "charged"

    assert retry.run_once("charge", {"n": 1}, meanwhile) == "charged"
    assert key_row("charge")["status"] == "completed"


def test_a_key_under_the_items_current_lease_is_in_progress_whatever_the_times_say():
    """The run is known by its token: a lease timestamp past the key's claim (a
    clock stepped back) does not make the live run that holds it look gone."""
    item = enqueue("job", "noop")
    live = context(claim("live"))
    ran: list[str] = []

    def effect() -> str:
        key = IdempotencyKey.objects.get(pk="mail")
        assert key.status == "pending"
        WorkItem.objects.filter(pk=item.pk).update(
            lease_acquired_at=key.created_at + timedelta(seconds=1)
        )
        with pytest.raises(IdempotencyInProgress):
            run_once("mail", {"to": "a"}, lambda: ran.append("again"), work_item=item.pk)
        return "sent"

    assert live.run_once("mail", {"to": "a"}, effect) == "sent"
    assert ran == []
    assert key_row("mail")["status"] == "completed"
