"""A sweep and a scheduler started before their database answers wait for it.

Each starts on a port where nothing listens yet; a few seconds later a relay
to the test's PostgreSQL opens on that port (`tests/ha/delayproxy.py`, no
delay). They used to exit 1 at once, so a process manager restarting them
quickly (systemd's `Restart=always`) could run out of its start limit while
PostgreSQL restarted, and leave no sweep at all.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from leasing import LeaseManager, enqueue
from leasing.models import WorkItem
from leasing.services.schedules import save_schedule
from leasing.ticks import parse_schedule
from tests.support.helpers import ROOT, database_url, pipe_lines, wait_for
from tests.support.recovery import expire
from tests.support.workers import leasing_env

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# How long nothing answers on the port before the relay opens.
DOWN_S = 1.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def late_database(spawn) -> Iterator[tuple[str, Callable[[], None]]]:
    """A DATABASE_URL whose port answers only once `open_relay()` is called."""
    url = urlsplit(database_url())
    port = _free_port()
    target = f"{url.hostname or '127.0.0.1'}:{url.port or 5432}"
    auth = url.netloc.rpartition("@")[0]
    late = urlunsplit(
        url._replace(netloc=f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}")
    )

    def open_relay() -> None:
        relay = spawn(str(ROOT / "tests/ha/delayproxy.py"), "--listen", f"127.0.0.1:{port}",
                      "--target", target, "--delay-ms", "0")  # fmt: skip
        assert relay.stdout is not None
        assert "listening" in relay.stdout.readline()

    yield late, open_relay


def test_a_sweep_started_before_its_database_waits_for_it(spawn, late_database):
    url, open_relay = late_database
    item = enqueue("t", "noop")
    LeaseManager("dead-worker").acquire_lease()
    expire(item.pk)
    proc = spawn("manage.py", "recoverysweep", "--json",
                 env={"DATABASE_URL": url, **leasing_env(SWEEP_INTERVAL=0.2)})  # fmt: skip
    stderr = pipe_lines(proc.stderr)
    stdout = pipe_lines(proc.stdout)
    assert "starting the sweep failed" in stderr.get(timeout=30)
    time.sleep(DOWN_S)
    assert proc.poll() is None, "the sweep exited while its database was down"
    open_relay()
    assert json.loads(stdout.get(timeout=30))["recovered"] == 1
    assert WorkItem.objects.get(pk=item.pk).status == "pending"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0


def test_a_scheduler_started_before_its_database_waits_for_it(spawn, late_database):
    url, open_relay = late_database
    save_schedule(parse_schedule("fast", {"work_type": "test.noop", "every": 1}))
    proc = spawn("manage.py", "runscheduler", env={"DATABASE_URL": url})
    stderr = pipe_lines(proc.stderr)
    stdout = pipe_lines(proc.stdout)
    assert "syncing the schedules failed" in stderr.get(timeout=30)
    time.sleep(DOWN_S)
    assert proc.poll() is None, "the scheduler exited while its database was down"
    open_relay()
    assert stdout.get(timeout=30).startswith("fast ")
    wait_for(lambda: WorkItem.objects.filter(work_type="test.noop").exists())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0


def test_a_stop_while_waiting_for_the_database_exits_0(spawn, late_database):
    url, _ = late_database
    for command, needle in (("recoverysweep", "starting the sweep"),
                            ("runscheduler", "syncing the schedules")):  # fmt: skip
        proc = spawn("manage.py", command, env={"DATABASE_URL": url})
        stderr = pipe_lines(proc.stderr)
        assert needle in stderr.get(timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, command
