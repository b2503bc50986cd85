"""Heartbeats: HeartbeatThread, Heartbeat, LeaseExtender."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from leasing import LeaseManager, WorkContext
from leasing.exceptions import (
    DatabaseUnavailable,
    InvalidHeartbeatInterval,
    InvalidInput,
    LeaseExpiredError,
    LeaseLostError,
)
from leasing.heartbeat import (
    Heartbeat,
    HeartbeatThread,
    LeaseExtender,
    LeaseExtenderConfig,
    start_heartbeat,
)
from leasing.models import Checkpoint, WorkItem
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db(transaction=True)


def claim(make_items, duration: float = 1.0):
    [item] = make_items(1)
    manager = LeaseManager("hb-worker")
    return manager, manager.acquire_lease(lease_duration_seconds=duration)


def test_heartbeat_thread_keeps_a_short_lease_alive(make_items):
    manager, lease = claim(make_items, duration=0.5)
    thread = start_heartbeat(manager, lease.id, interval_seconds=0.1, lease_duration_seconds=0.5)
    try:
        time.sleep(1.5)  # three lease lengths
        row = WorkItem.objects.get(pk=lease.id)
        assert row.lease_expires_at > database_now()
        assert thread.is_running()
        assert thread.renewals >= 8
    finally:
        thread.stop()
    assert not thread.is_running()


def test_heartbeat_thread_stops_and_reports_an_expired_lease(make_items):
    manager, lease = claim(make_items, duration=30)
    lost: list[tuple[str, BaseException]] = []
    reported = threading.Event()

    def on_lost(item_id: str, error: BaseException) -> None:
        lost.append((item_id, error))
        reported.set()

    WorkItem.objects.filter(pk=lease.id).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )
    thread = HeartbeatThread(
        manager, lease.id, interval_seconds=0.05, lease_duration_seconds=30, on_lease_lost=on_lost
    ).start()
    assert reported.wait(5)
    thread.stop()
    assert lost[0][0] == lease.id
    assert isinstance(lost[0][1], LeaseExpiredError)
    assert not thread.is_running()


class FlakyDatabaseManager(LeaseManager):
    """Fault injection: every renewal fails as if the database were unreachable."""

    def renew(self, *args, **kwargs):  # type: ignore[override]
        raise DatabaseUnavailable("Database unavailable: connection refused")

    renew_lease = renew  # type: ignore[assignment]


def test_heartbeat_gives_up_after_max_failures_and_the_context_refuses_writes(make_items):
    [item] = make_items(1, task_id="hb-task")
    manager = FlakyDatabaseManager("hb-worker")
    lease = manager.acquire_lease(lease_duration_seconds=30)
    context = WorkContext(lease, Heartbeat())
    reported = threading.Event()

    def on_lost(item_id: str, error: BaseException) -> None:
        context.mark_lease_lost(str(error))
        reported.set()

    thread = HeartbeatThread(
        manager,
        lease.id,
        interval_seconds=0.05,
        lease_duration_seconds=30,
        max_failures=3,
        on_lease_lost=on_lost,
    ).start()
    assert reported.wait(5)
    thread.stop()
    assert thread.consecutive_failures == 3
    assert isinstance(thread.lost_error, DatabaseUnavailable)
    assert context.lease_lost
    with pytest.raises(LeaseLostError):
        context.checkpoint("manual_checkpoint", {"after": "loss"})
    with pytest.raises(LeaseLostError):
        context.run_once("key-1", {"a": 1}, lambda: "side effect")
    assert not Checkpoint.objects.exists()
    # The row itself still shows the lease: only the database decides ownership.
    assert WorkItem.objects.get(pk=item.pk).lease_holder == "hb-worker"


@pytest.mark.postgres
def test_heartbeat_thread_closes_its_own_connection(make_items):
    manager, lease = claim(make_items, duration=5)

    def backends() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
            return cursor.fetchone()[0]

    before = backends()
    thread = start_heartbeat(manager, lease.id, interval_seconds=0.05, lease_duration_seconds=5)
    time.sleep(0.3)
    assert backends() == before + 1
    thread.stop()
    deadline = time.monotonic() + 5
    while backends() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backends() == before


def test_heartbeat_thread_validates_its_arguments(make_items):
    manager, lease = claim(make_items)
    with pytest.raises(InvalidHeartbeatInterval):
        HeartbeatThread(manager, lease.id, interval_seconds=5, lease_duration_seconds=5)
    with pytest.raises(InvalidInput):
        HeartbeatThread(manager, lease.id, interval_seconds=0, lease_duration_seconds=5)
    with pytest.raises(InvalidInput):
        HeartbeatThread(manager, lease.id, 1, 5, max_failures=0)


def test_heartbeat_beats_and_calls_back_outside_its_lock():
    seen: list[float] = []
    heartbeat = Heartbeat()
    # The callback reads the heartbeat: it would deadlock if called under the lock.
    heartbeat.on_beat = lambda: seen.append(heartbeat.elapsed())
    assert heartbeat.beats == 0
    time.sleep(0.05)
    assert heartbeat.elapsed() >= 0.05
    heartbeat.beat()
    heartbeat.beat()
    assert heartbeat.beats == 2
    assert len(seen) == 2 and seen[0] < 0.05
    assert heartbeat.elapsed() < 0.05


def test_heartbeat_is_thread_safe():
    heartbeat = Heartbeat()

    def beat_many() -> None:
        for _ in range(1000):
            heartbeat.beat()

    threads = [threading.Thread(target=beat_many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert heartbeat.beats == 8000


def test_lease_extender_extends_at_most_once_per_interval(make_items):
    manager, lease = claim(make_items, duration=2)
    heartbeat = Heartbeat()
    calls: list[int] = []
    heartbeat.on_beat = lambda: calls.append(1)  # an existing callback keeps working
    extender = LeaseExtender(LeaseExtenderConfig(interval=0.3, extension=20))
    with extender.attach(lease, heartbeat):
        for _ in range(50):
            heartbeat.beat()
        assert extender.extensions == 0  # the claim itself started the interval
        time.sleep(0.35)
        for _ in range(50):
            heartbeat.beat()
        assert extender.extensions == 1
        row = WorkItem.objects.get(pk=lease.id)
        assert row.lease_expires_at - row.heartbeat_at == timedelta(seconds=20)
        # The extension records the beat that made it: progress as of (just before) now.
        assert timedelta(0) <= row.heartbeat_at - row.progress_at < timedelta(seconds=1)
        time.sleep(0.35)
        heartbeat.beat()
        assert extender.extensions == 2
    assert len(calls) == 101
    heartbeat.beat()  # detached: no more extensions, old callback restored
    assert extender.extensions == 2 and len(calls) == 102


def test_lease_extender_logs_a_lost_lease_instead_of_raising(make_items):
    manager, lease = claim(make_items, duration=30)
    WorkItem.objects.filter(pk=lease.id).update(
        lease_expires_at=database_now() - timedelta(seconds=1)
    )
    lost = []
    extender = LeaseExtender(
        LeaseExtenderConfig(interval=0.01, extension=5),
        on_lease_lost=lambda item_id, exc: lost.append(exc),
    )
    heartbeat = Heartbeat()
    with extender.attach(lease, heartbeat):
        time.sleep(0.02)
        heartbeat.beat()  # must not raise
    assert isinstance(extender.lost_error, LeaseExpiredError)
    assert len(lost) == 1 and extender.extensions == 0


def test_disabled_extender_never_extends(make_items):
    manager, lease = claim(make_items, duration=30)
    before = WorkItem.objects.get(pk=lease.id).lease_expires_at
    extender = LeaseExtender(LeaseExtenderConfig(interval=0.01, extension=5, enabled=False))
    heartbeat = Heartbeat()
    with extender.attach(lease, heartbeat):
        time.sleep(0.02)
        heartbeat.beat()
    assert extender.extensions == 0
    assert WorkItem.objects.get(pk=lease.id).lease_expires_at == before


@pytest.mark.parametrize(
    "kwargs", [{"interval": 0}, {"extension": -1}, {"interval": 10, "extension": 10}]
)
def test_extender_config_is_validated(kwargs):
    with pytest.raises(InvalidInput):
        LeaseExtenderConfig(**kwargs)
