"""Idempotency keys: a side effect runs once per key."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.db.transaction import TransactionManagementError

from leasing import LeaseManager, RecoverySweep, WorkContext, enqueue
from leasing.exceptions import (
    IdempotencyConflict,
    IdempotencyInProgress,
    InvalidDuration,
    InvalidIdempotencyKey,
    InvalidInput,
    PayloadNotSerializable,
    WorkItemNotFound,
)
from leasing.models import IdempotencyKey, Worker, WorkItem
from leasing.services.idempotency import request_hash, run_once
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db


class Effect:
    """A side effect that counts how often it really ran (thread-safe)."""

    def __init__(self, result: Any = None, *, error: BaseException | None = None, delay=0.0):
        self.result = result
        self.error = error
        self.delay = delay
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        with self._lock:
            self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return self.result


def key_row(key: str) -> dict[str, Any]:
    return IdempotencyKey.objects.filter(pk=key).values().get()


def all_keys() -> list[dict[str, Any]]:
    return list(IdempotencyKey.objects.order_by("pk").values())


def make_pending(key: str, request: Any, **fields: Any) -> None:
    """A pending key as a crashed (or still running) run leaves it."""
    IdempotencyKey.objects.create(
        idempotency_key=key,
        request_hash=request_hash(request),
        status="pending",
        expires_at=database_now() + timedelta(hours=1),
        **fields,
    )


# --- the happy paths --------------------------------------------------------------------------


def test_first_call_runs_and_stores_the_response(db):
    effect = Effect({"charge_id": "ch_1", "amount": 1200})
    request = {"order": 7, "amount": 1200, "note": "café"}

    before = database_now()
    assert run_once("charge:7", request, effect, task_id="orders") == effect.result
    after = database_now()

    assert effect.calls == 1
    row = key_row("charge:7")
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert row["request_hash"] == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert row["status"] == "completed"
    assert row["response_data"] == {"charge_id": "ch_1", "amount": 1200}
    assert row["task_id"] == "orders" and row["work_item_id"] is None
    assert before <= row["created_at"] <= row["completed_at"] <= after
    assert row["expires_at"] - row["created_at"] == timedelta(hours=24)


def test_same_key_and_request_returns_the_cached_response_without_running(db):
    effect = Effect(("tuple", 1))
    first = run_once("k", {"a": 1, "b": [1, 2]}, effect)
    second = run_once("k", {"b": [1, 2], "a": 1}, effect)  # same canonical JSON
    assert effect.calls == 1
    assert first == second == ["tuple", 1]  # the stored JSON, the first time too
    none_effect = Effect(None)
    assert run_once("k-none", [], none_effect) is None
    assert run_once("k-none", [], none_effect) is None
    assert none_effect.calls == 1


def test_same_key_with_another_request_conflicts_and_runs_nothing(db):
    effect = Effect("ok")
    run_once("k", {"amount": 10}, effect)
    before = all_keys()
    with pytest.raises(IdempotencyConflict):
        run_once("k", {"amount": 11}, effect)
    assert effect.calls == 1
    assert all_keys() == before


def test_a_failed_run_is_not_cached_and_runs_again(db):
    failing = Effect(error=RuntimeError("gateway timeout"))
    with pytest.raises(RuntimeError, match="gateway timeout"):
        run_once("k", {"x": 1}, failing)
    row = key_row("k")
    assert row["status"] == "failed" and row["response_data"] is None

    working = Effect({"ok": True})
    assert run_once("k", {"x": 1}, working) == {"ok": True}
    assert (failing.calls, working.calls) == (1, 1)
    assert key_row("k")["status"] == "completed"
    assert run_once("k", {"x": 1}, working) == {"ok": True}
    assert working.calls == 1


def test_an_outage_while_marking_a_failed_run_logs_one_line_and_keeps_its_error(
    db, monkeypatch, caplog
):
    """The effect's own exception reaches the caller; the outage that kept the key
    from being marked failed is one warning line (the key is taken over later)."""
    from leasing.exceptions import DatabaseUnavailable
    from leasing.services import idempotency

    real = idempotency.run

    def down_for_the_mark(using, statement):
        if "UPDATE" in statement[0] and "failed" in statement[1]:
            raise DatabaseUnavailable("Database unavailable: server login has been failing")
        return real(using, statement)

    monkeypatch.setattr(idempotency, "run", down_for_the_mark)
    with pytest.raises(RuntimeError, match="gateway timeout"):
        run_once("k", {"x": 1}, Effect(error=RuntimeError("gateway timeout")))
    [record] = [r for r in caplog.records if "could not mark it failed" in r.getMessage()]
    assert record.levelname == "WARNING" and record.exc_info is None
    assert "server login has been failing" in record.getMessage()
    assert key_row("k")["status"] == "pending"


def test_an_expired_key_behaves_as_absent(db):
    effect = Effect("first")
    run_once("k", {"v": 1}, effect)
    IdempotencyKey.objects.filter(pk="k").update(expires_at=database_now() - timedelta(seconds=1))
    again = Effect("second")
    # Even a different request: the old key is forgotten, not a conflict.
    assert run_once("k", {"v": 2}, again) == "second"
    assert again.calls == 1
    row = key_row("k")
    assert row["request_hash"] == request_hash({"v": 2})
    assert row["response_data"] == "second"
    assert row["expires_at"] > database_now()


def test_ttl_comes_from_the_argument_or_the_setting(db, leasing_settings):
    run_once("a", 1, Effect(1), ttl=timedelta(minutes=5))
    run_once("b", 1, Effect(1), ttl=30)
    leasing_settings(IDEMPOTENCY_TTL=90)
    run_once("c", 1, Effect(1))
    spans = {
        k["idempotency_key"]: k["expires_at"] - k["created_at"]
        for k in IdempotencyKey.objects.values()
    }
    assert spans == {
        "a": timedelta(minutes=5),
        "b": timedelta(seconds=30),
        "c": timedelta(seconds=90),
    }


# --- pending keys and their owners ---------------------------------------------------------


def test_a_pending_key_of_a_live_run_raises_in_progress(db):
    make_pending("k", {"x": 1})
    effect = Effect()
    before = all_keys()
    with pytest.raises(IdempotencyInProgress):
        run_once("k", {"x": 1}, effect)
    assert effect.calls == 0
    assert all_keys() == before


def test_a_pending_key_without_a_work_item_is_abandoned_after_a_lease_duration(db):
    make_pending("k", {"x": 1})
    IdempotencyKey.objects.filter(pk="k").update(created_at=database_now() - timedelta(seconds=301))
    effect = Effect("took over")
    assert run_once("k", {"x": 1}, effect) == "took over"
    assert effect.calls == 1
    assert key_row("k")["status"] == "completed"


def test_a_pending_key_whose_owner_still_holds_its_lease_raises_in_progress(db):
    item = enqueue("job", "noop")
    LeaseManager("owner").acquire_lease(lease_duration_seconds=60)
    make_pending("k", {"x": 1}, work_item_id=item.pk, task_id="job")
    effect = Effect()
    with pytest.raises(IdempotencyInProgress):
        run_once("k", {"x": 1}, effect, work_item=item.pk)
    assert effect.calls == 0
    assert key_row("k")["status"] == "pending"


@pytest.mark.parametrize("owner_fate", ["lease_expired", "completed", "requeued"])
def test_a_pending_key_whose_owner_is_gone_is_taken_over(db, owner_fate):
    item = enqueue("job", "noop")
    manager = LeaseManager("owner")
    manager.acquire_lease(lease_duration_seconds=60)
    make_pending("k", {"x": 1}, work_item_id=item.pk, task_id="job")
    if owner_fate == "lease_expired":
        WorkItem.objects.filter(pk=item.pk).update(
            lease_expires_at=database_now() - timedelta(seconds=1)
        )
    elif owner_fate == "completed":
        manager.release_lease(item.pk, success=True)
    else:
        manager.requeue_lease(item.pk)
    effect = Effect({"done": 1})
    assert run_once("k", {"x": 1}, effect, work_item=item.pk) == {"done": 1}
    assert effect.calls == 1
    row = key_row("k")
    assert row["status"] == "completed" and row["work_item_id"] == item.pk


def test_a_retry_of_the_same_item_after_a_crash_takes_its_key_over(db):
    item = enqueue("job", "noop")
    crashed = LeaseManager("crashed").acquire_lease(lease_duration_seconds=30)
    # The first attempt claimed the key, then its process died mid-effect.
    make_pending("k", {"x": 1}, work_item_id=item.pk, task_id="job")
    WorkItem.objects.filter(pk=item.pk).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )
    assert RecoverySweep(scan_interval_seconds=5).scan_and_recover().recovered == 1
    retry = LeaseManager("retry").acquire_lease(lease_duration_seconds=60)
    assert retry.work_item_id == item.pk and retry.token == crashed.token + 1
    # The item is in_progress with a live lease again, but it was claimed after
    # the key was created: the key's owner is the dead attempt.
    effect = Effect("charged once")
    assert run_once("k", {"x": 1}, effect, work_item=item.pk) == "charged once"
    assert effect.calls == 1


def test_work_context_run_once_records_task_and_item(db):
    item = enqueue("job", "noop")
    lease = LeaseManager("w").acquire_lease()
    ctx = WorkContext(lease, heartbeat=None)  # type: ignore[arg-type]
    effect = Effect({"sent": True})
    assert ctx.run_once("email:1", {"to": "a@example.com"}, effect) == {"sent": True}
    assert ctx.run_once("email:1", {"to": "a@example.com"}, effect) == {"sent": True}
    assert ctx.run_once("email:2", {}, effect, ttl=timedelta(seconds=10)) == {"sent": True}
    assert effect.calls == 2
    row = key_row("email:1")
    assert (row["task_id"], row["work_item_id"]) == ("job", item.pk)
    row = key_row("email:2")
    assert row["expires_at"] - row["created_at"] == timedelta(seconds=10)


# --- concurrency --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_calls_with_one_key_run_fn_once(db, threads):
    effect = Effect({"charged": 1}, delay=0.3)

    def call(i: int) -> Any:
        try:
            return run_once("charge", {"amount": 1}, effect)
        except IdempotencyInProgress:
            return "in progress"

    results = threads(8, call)

    assert effect.calls == 1
    assert results.count({"charged": 1}) == 1
    assert results.count("in progress") == 7
    assert key_row("charge")["status"] == "completed"


@pytest.mark.django_db(transaction=True)
def test_concurrent_callers_that_wait_all_get_the_one_result(db, threads):
    effect = Effect({"charged": 1}, delay=0.3)
    results = threads(6, lambda i: run_once("charge", {"amount": 1}, effect, wait_seconds=10))
    assert effect.calls == 1
    assert results == [{"charged": 1}] * 6


@pytest.mark.django_db(transaction=True)
def test_a_waiting_caller_runs_fn_itself_when_the_first_run_fails(db, threads):
    failing = Effect(error=RuntimeError("down"), delay=0.3)
    working = Effect("second try")

    def call(i: int) -> Any:
        if i == 0:
            with pytest.raises(RuntimeError):
                run_once("k", 1, failing)
            return "failed"
        time.sleep(0.1)  # arrive while the first run is pending
        return run_once("k", 1, working, wait_seconds=10)

    assert threads(2, call) == ["failed", "second try"]
    assert (failing.calls, working.calls) == (1, 1)


# --- bad input ---------------------------------------------------------------------------


def test_bad_input_gets_a_specific_error_and_writes_nothing(db):
    effect = Effect("x")
    cases = [
        (InvalidIdempotencyKey, lambda: run_once("k" * 256, {}, effect)),
        (InvalidIdempotencyKey, lambda: run_once("", {}, effect)),
        (InvalidIdempotencyKey, lambda: run_once("   ", {}, effect)),
        (InvalidIdempotencyKey, lambda: run_once(None, {}, effect)),
        (InvalidIdempotencyKey, lambda: run_once(42, {}, effect)),
        (InvalidIdempotencyKey, lambda: run_once("a\x00b", {}, effect)),
        (PayloadNotSerializable, lambda: run_once("k", {"when": object()}, effect)),
        (PayloadNotSerializable, lambda: run_once("k", float("nan"), effect)),
        (InvalidInput, lambda: run_once("k", {}, "not callable")),
        (InvalidDuration, lambda: run_once("k", {}, effect, ttl=0)),
        (InvalidDuration, lambda: run_once("k", {}, effect, ttl=timedelta(seconds=-1))),
        (InvalidDuration, lambda: run_once("k", {}, effect, ttl="1h")),
        (InvalidDuration, lambda: run_once("k", {}, effect, wait_seconds=-1)),
        (InvalidDuration, lambda: run_once("k", {}, effect, wait_seconds=float("nan"))),
        (WorkItemNotFound, lambda: run_once("k", {}, effect, work_item="01NOSUCHITEM")),
        (InvalidInput, lambda: run_once("k", {}, effect, task_id="")),
    ]
    for error, call in cases:
        with pytest.raises(error):
            call()
    assert effect.calls == 0
    assert all_keys() == []
    # 255 characters is fine.
    assert run_once("k" * 255, {}, effect) == "x"


def test_a_response_that_cannot_be_stored_fails_the_key(db):
    effect = Effect({"handle": object()})
    with pytest.raises(PayloadNotSerializable):
        run_once("k", {}, effect)
    assert effect.calls == 1
    assert key_row("k")["status"] == "failed"  # a retry runs it again, visibly


def test_run_once_refuses_to_run_inside_a_transaction(db):
    effect = Effect("x")
    with pytest.raises(TransactionManagementError), transaction.atomic():
        run_once("k", {}, effect)
    assert effect.calls == 0
    assert all_keys() == []


# --- atomic: the effect and its record commit together ------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_atomic_effect_commits_with_its_record():
    from leasing.services.processes import register

    def effect():
        register("effect-row", heartbeat_interval=1.0)  # a row in the same database
        return {"done": True}

    assert run_once("atomic-1", {"n": 1}, effect, atomic=True) == {"done": True}
    assert Worker.objects.filter(pk="effect-row").exists()
    assert IdempotencyKey.objects.get(pk="atomic-1").status == "completed"
    # The second call replays the record and runs nothing.
    assert run_once("atomic-1", {"n": 1}, lambda: pytest.fail("ran twice"), atomic=True) == {
        "done": True
    }


@pytest.mark.django_db(transaction=True)
def test_an_atomic_effect_that_fails_is_rolled_back_with_nothing_recorded_as_done():
    from leasing.services.processes import register

    def effect():
        register("half-done", heartbeat_interval=1.0)
        raise RuntimeError("the process dies here")

    with pytest.raises(RuntimeError):
        run_once("atomic-2", {"n": 2}, effect, atomic=True)
    assert not Worker.objects.filter(pk="half-done").exists()
    assert IdempotencyKey.objects.get(pk="atomic-2").status == "failed"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_atomic_effect_whose_key_was_taken_over_meanwhile_is_rolled_back():
    import psycopg

    from leasing.exceptions import IdempotencyInProgress
    from leasing.services.processes import register
    from tests.support.helpers import database_url

    def effect():
        register("overtaken", heartbeat_interval=1.0)
        # Another run takes the key over (a new claim) while this effect runs.
        with psycopg.connect(database_url(), autocommit=True) as other:
            other.execute(
                "UPDATE idempotency_keys SET created_at = created_at + interval '1 second' "
                "WHERE idempotency_key = 'atomic-3'"
            )
        return {"done": True}

    with pytest.raises(IdempotencyInProgress, match="rolled back"):
        run_once("atomic-3", {"n": 3}, effect, atomic=True)
    assert not Worker.objects.filter(pk="overtaken").exists()
