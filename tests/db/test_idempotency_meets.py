"""Idempotency keys where they meet lost leases, retries, operator actions and expiry."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from leasing import LeaseLostError, LeaseManager, RecoverySweep, apply_action, enqueue
from leasing.exceptions import (
    IdempotencyInProgress,
    InvalidDuration,
    InvalidIdempotencyKey,
    InvalidInput,
)
from leasing.models import IdempotencyKey, Worker, WorkItem
from leasing.services.idempotency import run_once
from tests.support.helpers import database_now
from tests.support.items import claim, context

pytestmark = pytest.mark.django_db


class Effect:
    """A side effect that counts how often it really ran; `during` runs inside it."""

    def __init__(self, result: Any = None, during: Any = None) -> None:
        self.result = result
        self.during = during
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        if self.during is not None:
            self.during()
        return self.result


def ops(action: str, item_id: str) -> None:
    result = apply_action(action, item_id, expected_token=None, actor="ops", reason="test")
    assert result.applied, result.detail


def key_row(key: str) -> dict[str, Any]:
    return IdempotencyKey.objects.filter(pk=key).values().get()


def all_keys() -> list[dict[str, Any]]:
    return list(IdempotencyKey.objects.order_by("pk").values())


def past_expiry(key: str) -> None:
    IdempotencyKey.objects.filter(pk=key).update(expires_at=database_now() - timedelta(seconds=1))


def sweep() -> RecoverySweep:
    return RecoverySweep(scan_interval_seconds=5)


# --- a run that lost its lease while fn ran -------------------------------------------------


def test_a_run_force_released_while_fn_ran_records_nothing_and_the_next_attempt_runs_it(db):
    """The fenced-out run recorded its response as if it still held the lease."""
    item = enqueue("job", "noop")
    zombie = context(claim("slow"))
    effect = Effect({"sent": 1}, during=lambda: ops("force_release", item.pk))

    with pytest.raises(LeaseLostError, match="not recorded"):
        zombie.run_once("mail:1", {"to": "a"}, effect)

    assert effect.calls == 1 and zombie.lease_lost
    row = key_row("mail:1")
    assert (row["status"], row["response_data"]) == ("pending", None)
    # The next attempt takes the key over and runs the effect again: at least once,
    # as documented for an effect that ran just before its run lost the lease.
    successor = context(claim("fresh"))
    again = Effect({"sent": 2})
    assert successor.run_once("mail:1", {"to": "a"}, again) == {"sent": 2}
    assert again.calls == 1
    assert successor.run_once("mail:1", {"to": "a"}, again) == {"sent": 2}
    assert again.calls == 1
    assert key_row("mail:1")["status"] == "completed"


def test_a_run_recovered_by_the_sweep_while_fn_failed_leaves_the_key_to_its_retry(db):
    item = enqueue("job", "noop")
    zombie = context(claim("slow"))

    def dies_after_the_sweep() -> None:
        WorkItem.objects.filter(pk=item.pk).update(
            lease_expires_at=database_now() - timedelta(seconds=1)
        )
        assert sweep().scan_and_recover().recovered == 1
        raise RuntimeError("gateway timeout")

    with pytest.raises(RuntimeError, match="gateway timeout"):
        zombie.run_once("charge", {"n": 1}, Effect(during=dies_after_the_sweep))
    assert key_row("charge")["status"] == "pending"  # the fenced mark was refused

    retry = context(claim("retry"))
    assert retry.run_once("charge", {"n": 1}, Effect("charged")) == "charged"
    assert key_row("charge")["status"] == "completed"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_atomic_effect_of_a_run_that_lost_its_lease_meanwhile_is_rolled_back():
    """Its effect (a row in this database) committed with its record after an
    operator had taken the lease away: a write under a lease, unfenced."""
    from leasing.services.processes import register

    item = enqueue("job", "noop")
    zombie = context(claim("slow"))

    def effect() -> dict[str, bool]:
        register("effect-row", heartbeat_interval=1.0)
        # An operator force-releases the item from another connection meanwhile.
        other = threading.Thread(target=force_release_elsewhere, args=(item.pk,))
        other.start()
        other.join(30)
        return {"done": True}

    with pytest.raises(LeaseLostError, match="rolled back"):
        zombie.run_once("ledger:1", {"n": 1}, effect, atomic=True)

    assert not Worker.objects.filter(pk="effect-row").exists()
    assert WorkItem.objects.get(pk=item.pk).status == "pending"
    # The next attempt performs the effect for the first time: exactly once.
    successor = context(claim("fresh"))
    ran = Effect({"done": True}, during=lambda: register("effect-row", heartbeat_interval=1.0))
    assert successor.run_once("ledger:1", {"n": 1}, ran, atomic=True) == {"done": True}
    assert Worker.objects.filter(pk="effect-row").count() == 1
    assert key_row("ledger:1")["status"] == "completed"


def force_release_elsewhere(item_id: str) -> None:
    from django.db import connection

    try:
        ops("force_release", item_id)
    finally:
        connection.close()


# --- expiry while the item that made the key is unfinished --------------------------------


def test_a_key_of_an_item_waiting_for_its_retry_outlives_its_ttl(db):
    """The sweep deleted it on time, and the retry ran the side effect a second time."""
    item = enqueue("job", "noop", max_retries=3)
    first = context(claim())
    effect = Effect({"charged": 1200})
    assert first.run_once("charge:7", {"amount": 1200}, effect, ttl=timedelta(seconds=30)) == {
        "charged": 1200
    }
    LeaseManager("w").release_lease(
        item.pk, success=False, error="later step", retry=True, token=first.lease.token
    )
    assert WorkItem.objects.get(pk=item.pk).status == "pending"
    past_expiry("charge:7")

    assert sweep().scan_and_recover().keys_expired == 0
    assert IdempotencyKey.objects.filter(pk="charge:7").exists()

    ops("run_now", item.pk)  # its backoff is over
    retry = context(claim())
    assert retry.attempt == 2
    assert retry.run_once("charge:7", {"amount": 1200}, effect) == {"charged": 1200}
    assert effect.calls == 1

    # Once the item is finished the key expires as usual.
    LeaseManager("w").release_lease(item.pk, success=True, token=retry.lease.token)
    assert sweep().scan_and_recover().keys_expired == 1
    assert not IdempotencyKey.objects.exists()


def test_a_key_of_a_running_item_past_its_ttl_is_not_run_again(db):
    item = enqueue("job", "noop")
    run = context(claim())
    effect = Effect("sent")
    run.run_once("mail", {"to": "a"}, effect, ttl=timedelta(seconds=30))
    past_expiry("mail")

    # Another caller that names the key (a web request, another item) still sees it.
    assert run_once("mail", {"to": "a"}, effect) == "sent"
    assert run.run_once("mail", {"to": "a"}, effect) == "sent"
    assert effect.calls == 1
    assert sweep().scan_and_recover().keys_expired == 0
    # Failed for good, it may still be retried by an operator: its key stays.
    ops("force_fail", item.pk)
    assert sweep().scan_and_recover().keys_expired == 0


def test_an_operator_retry_long_after_the_ttl_does_not_run_the_effect_again(db):
    """A handler charged once, then failed for good; days later (past IDEMPOTENCY_TTL,
    the sweep having run) the bug is fixed and an operator retries it."""
    item = enqueue("job", "noop", max_retries=0)
    failed = context(claim())
    charge = Effect({"charged": 1200})
    failed.run_once("charge:9", {"amount": 1200}, charge, ttl=timedelta(seconds=30))
    ops("force_fail", item.pk)
    past_expiry("charge:9")
    assert sweep().scan_and_recover().keys_expired == 0  # was: deleted, and charged again

    ops("retry", item.pk)
    retried = context(claim())
    assert retried.run_once("charge:9", {"amount": 1200}, charge) == {"charged": 1200}
    assert charge.calls == 1

    # Completed, nothing can run it again: the key expires as usual.
    LeaseManager("w").release_lease(item.pk, success=True, token=retried.lease.token)
    assert sweep().scan_and_recover().keys_expired == 1


# --- operator actions -------------------------------------------------------------------------


def test_an_operator_retry_replays_what_the_failed_attempt_recorded(db):
    item = enqueue("job", "noop", max_retries=0)
    failed = context(claim())
    sent = Effect("sent")
    failed.run_once("mail", {"to": "a"}, sent)
    ops("force_fail", item.pk)
    ops("retry", item.pk)

    retried = context(claim())
    assert retried.run_once("mail", {"to": "a"}, sent) == "sent"
    assert sent.calls == 1


# --- bad input through the context ------------------------------------------------------------


BAD_KEYS_AND_TTLS = {
    "empty": ("", None, InvalidIdempotencyKey),
    "blank": ("   ", None, InvalidIdempotencyKey),
    "nul": ("a\x00b", None, InvalidIdempotencyKey),
    "surrogate": ("a\ud800", None, InvalidIdempotencyKey),
    "10k-text": ("k" * 10_000, None, InvalidIdempotencyKey),
    "10k-bytes": (b"k" * 10_000, None, InvalidIdempotencyKey),
    "list": (["k"] * 5_000, None, InvalidIdempotencyKey),
    "int": (42, None, InvalidIdempotencyKey),
    "5000-digit-int": (10**5000, None, InvalidIdempotencyKey),
    "ttl-negative": ("k", -1, InvalidDuration),
    "ttl-zero": ("k", 0, InvalidDuration),
    "ttl-nan": ("k", float("nan"), InvalidDuration),
    "ttl-inf": ("k", float("inf"), InvalidDuration),
    "ttl-10**400": ("k", 10**400, InvalidDuration),
    "ttl-10**5000": ("k", 10**5000, InvalidDuration),
    "ttl-1e300": ("k", 1e300, InvalidDuration),
    "ttl-negative-timedelta": ("k", timedelta(days=-1), InvalidDuration),
    "ttl-timedelta-max": ("k", timedelta.max, InvalidDuration),
    "ttl-text": ("k", "1h", InvalidDuration),
    "ttl-bool": ("k", True, InvalidDuration),
}


@pytest.mark.parametrize(
    "key, ttl, error", list(BAD_KEYS_AND_TTLS.values()), ids=list(BAD_KEYS_AND_TTLS)
)
def test_a_bad_key_or_ttl_is_a_short_clear_error_and_the_run_keeps_its_lease(db, key, ttl, error):
    item = enqueue("job", "noop")
    ctx = context(claim())
    effect = Effect("x")

    with pytest.raises(error) as raised:
        ctx.run_once(key, {"n": 1}, effect, ttl=ttl)

    assert len(str(raised.value)) < 200
    assert effect.calls == 0 and all_keys() == []
    assert not ctx.lease_lost
    row = WorkItem.objects.get(pk=item.pk)
    assert (row.status, row.lease_token, row.retry_count) == ("in_progress", ctx.lease.token, 0)
    assert ctx.run_once("k", {"n": 1}, effect) == "x"


@pytest.mark.parametrize(
    "wait",
    [-1, float("nan"), float("inf"), 10**400, 1e300, "1s", True],
    ids=["negative", "nan", "inf", "10**400", "1e300", "text", "bool"],
)
def test_a_bad_wait_is_a_clear_error_that_writes_nothing(db, wait):
    effect = Effect("x")
    with pytest.raises(InvalidInput) as raised:
        run_once("k", {}, effect, wait_seconds=wait)
    assert isinstance(raised.value, InvalidDuration)
    assert effect.calls == 0 and all_keys() == []


# --- run_once outside a handler, under a lease ----------------------------------------------


def test_a_key_claimed_under_a_lease_belongs_to_the_leased_item(db):
    """Without `work_item=` the key named no item: its owner counted as gone after
    LEASE_DURATION however alive the lease, and another caller ran fn again."""
    item = enqueue("job", "noop")
    lease = claim()
    assert run_once("mail", {"to": "a"}, Effect("sent"), lease=lease) == "sent"
    row = key_row("mail")
    assert (row["work_item_id"], row["task_id"]) == (item.pk, "job")

    second = Effect("again")
    seen: list[str] = []

    def long_effect() -> None:
        # Six minutes into the effect (past LEASE_DURATION), its lease renewed all along...
        then = database_now() - timedelta(seconds=360)
        WorkItem.objects.filter(pk=item.pk).update(lease_acquired_at=then - timedelta(seconds=1))
        IdempotencyKey.objects.filter(pk="charge").update(created_at=then)
        # ...another caller comes for the same key.
        try:
            run_once("charge", {"n": 1}, second)
        except IdempotencyInProgress:
            seen.append("in progress")

    run_once("charge", {"n": 1}, Effect(during=long_effect), lease=lease)
    assert seen == ["in progress"] and second.calls == 0


def test_a_work_item_or_task_other_than_the_leased_ones_is_refused(db):
    enqueue("job", "noop")
    other = enqueue("elsewhere", "noop")
    lease = LeaseManager("w").acquire_lease(task_id_filter="job")
    effect = Effect("x")
    for call in (
        lambda: run_once("k", {}, effect, lease=lease, work_item=other.pk),
        lambda: run_once("k", {}, effect, lease=lease, work_item=other),
        lambda: run_once("k", {}, effect, lease=lease, task_id="elsewhere"),
        lambda: run_once("k", {}, effect, lease="token 1"),
    ):
        with pytest.raises(InvalidInput):
            call()
    assert effect.calls == 0 and all_keys() == []
    assert run_once("k", {}, effect, lease=lease, work_item=lease.work_item_id, task_id="job")
