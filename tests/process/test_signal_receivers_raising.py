"""A signal receiver that raises a BaseException (KeyboardInterrupt, SystemExit,
GeneratorExit, a subclass of its own) never reaches a real `runworker`: the
receivers after it still run, the lease renewer keeps renewing, and the worker
completes its items and stops as it would without it (PostgreSQL and SQLite).

The receivers come from an app of the test's own settings (`site_settings`):
each signal has one that raises, connected first, and one that records what
it received, connected after it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from leasing import enqueue
from leasing.models import Worker
from tests.support.helpers import ROOT, site_settings
from tests.support.workers import leasing_env, parse_summary

pytestmark = pytest.mark.django_db(transaction=True)

RECEIVERS = '''
import itertools
import os

from django.apps import AppConfig


class Raised(BaseException):
    """A BaseException of the site's own."""


RAISED = itertools.cycle([KeyboardInterrupt, SystemExit, GeneratorExit, Raised])


def record(signal_name, work_item_id, token):
    with open(os.environ["RECEIVED_LOG"], "a") as log:
        log.write(f"{signal_name} {work_item_id} {token}\\n")


def raiser(signal_name):
    def receive(sender, work_item_id, token, **kwargs):
        record(f"raised-{signal_name}", work_item_id, token)
        raise next(RAISED)(f"a receiver of {signal_name} raised")

    return receive


def recorder(signal_name):
    def receive(sender, work_item_id, token, **kwargs):
        record(signal_name, work_item_id, token)

    return receive


class RaisingReceivers(AppConfig):
    name = "raising_receivers"

    def ready(self):
        from leasing import signals

        for name in os.environ["RAISE_ON"].split(","):
            signal = getattr(signals, name)
            signal.connect(raiser(name), weak=False)
            signal.connect(recorder(name), weak=False)
'''

# Leases short enough that an item outlives several, renewed at least twice a lease.
LEASES = {"LEASE_DURATION": 4, "HEARTBEAT_INTERVAL": 0.5, "RETRY_BACKOFF_BASE": 0.05}
ITEM_SECONDS = 6


def run_burst(subprocess_env, tmp_path: Path, raise_on: str) -> subprocess.CompletedProcess:
    (tmp_path / "raising_receivers.py").write_text(RECEIVERS)
    env = site_settings(
        tmp_path, 'INSTALLED_APPS = [*INSTALLED_APPS, "raising_receivers.RaisingReceivers"]\n'
    )
    env.update(
        DATABASE_URL=subprocess_env["DATABASE_URL"],
        RECEIVED_LOG=str(tmp_path / "received.log"),
        RAISE_ON=raise_on,
        **leasing_env(**LEASES),
    )
    return subprocess.run(
        [sys.executable, "manage.py", "runworker", "--burst", "--concurrency", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def received(tmp_path: Path) -> list[tuple[str, str, int]]:
    log = tmp_path / "received.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [(what, item, int(token)) for what, item, token in map(str.split, lines)]


def assert_completed_on_their_first_claim(proc, items) -> None:
    for item in items:
        item.refresh_from_db()
        assert (item.status, item.lease_token) == ("completed", 1), proc.stderr[-3000:]
    # The log lines without their prefix: the summary line is the worker's last.
    summary = parse_summary(re.sub(r"(?m)^.* leasing\.worker: ", "", proc.stderr))
    assert (summary["reason"], summary["completed"]) == ("burst-done", 2), proc.stderr[-3000:]
    assert proc.returncode == 0
    worker = Worker.objects.get(worker_id=summary["worker_id"])
    assert worker.status == Worker.Status.STOPPED


def test_acquired_receivers_raising_base_exceptions_leave_the_worker_running(
    subprocess_env, tmp_path
):
    items = [enqueue(f"acq-{i}", "test.sleep", {"seconds": 0.2}) for i in range(2)]
    proc = run_burst(subprocess_env, tmp_path, "lease_acquired")
    assert_completed_on_their_first_claim(proc, items)
    events = received(tmp_path)
    expected = {(item.pk, 1) for item in items}
    assert {(i, t) for what, i, t in events if what == "raised-lease_acquired"} == expected
    # The receiver connected after the raising one still heard of both claims.
    assert {(i, t) for what, i, t in events if what == "lease_acquired"} == expected
    assert "a receiver of a lease signal failed" in proc.stderr


def test_renewed_receivers_raising_base_exceptions_do_not_stop_the_renewals(
    subprocess_env, tmp_path
):
    items = [enqueue(f"renew-{i}", "test.sleep", {"seconds": ITEM_SECONDS}) for i in range(2)]
    proc = run_burst(subprocess_env, tmp_path, "lease_renewed")
    assert_completed_on_their_first_claim(proc, items)
    events = received(tmp_path)
    for item in items:
        raised = [e for e in events if e == ("raised-lease_renewed", item.pk, 1)]
        recorded = [e for e in events if e == ("lease_renewed", item.pk, 1)]
        # Every renewal raised, and the renewer went on: an item of one and a half
        # leases is renewed at least every half lease (the first raise killed it before).
        assert len(raised) >= ITEM_SECONDS / (LEASES["LEASE_DURATION"] / 2) - 1, events
        assert len(recorded) == len(raised), events
