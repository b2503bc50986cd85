"""A rate limit holds across eight real worker processes on two simulated hosts (PostgreSQL).

Eight `runworker` processes (four handler threads each) run on two simulated
hosts, four with the hostname `rate-host-a` and four with `rate-host-b`. As
root with a local server, each host is a network namespace on a test bridge
(tests/ha/network.py) whose workers reach PostgreSQL over their veth, through a
relay on the bridge (socat; the server listens on 127.0.0.1 only); otherwise
each host is a UTS namespace (`unshare --uts`) on this host's network; where
neither is allowed, eight processes on this host with the hosts in their
worker ids. The test says which it ran.

Two rate keys, `hot` and `cold`, each hold a backlog far larger than 50 a
second can drain, under `key:*` = 50 a second with a burst of 75. Over a 10 s
window from one second after each key's first admission (that second holds
the bucket's initial burst):

* each key's admitted rate is within 5% of 50 a second (the 60 s figure is
  the bench scenario's, `bench/rate_limits.py`);
* no window of one second admits more than the burst (75), by the claim
  times, which are the instants the buckets admitted the items;
* the two keys do not share a budget: each gets its own 50 a second.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import pairwise
from urllib.parse import urlsplit

import pytest

from leasing import enqueue_many
from leasing.models import Worker, WorkItem
from tests.ha.network import Host, Site, TestNetwork
from tests.support.helpers import ROOT
from tests.support.workers import leasing_env, stop_workers

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RATE = 50
# How late a claim may come without losing a turn is (BURST - RATE) / RATE = 0.5 s: on a
# shared test host a claimer holding a bucket's lock is at times descheduled for 0.3 s.
BURST = 75
WINDOW = 10.0
WARM_UP = 1.0  # the window starts after the first second, which holds the initial burst
BACKLOG = 1200  # per key: more than the window can admit
HOSTS = ("rate-host-a", "rate-host-b")
LOCAL = ("127.0.0.1", "localhost")


def namespaces_allowed() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--uts", "sh", "-c", "hostname rate-probe"], capture_output=True, check=False
    )
    return probe.returncode == 0


def free_subnet() -> int:
    """A 198.18.X.0/24 no interface here uses (the HA suite's is 198.18.0.0/24)."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    for subnet in range(100, 200):
        if f" 198.18.{subnet}." not in used:
            return subnet
    raise RuntimeError("no free 198.18.X.0/24")


@contextlib.contextmanager
def network_hosts(database_url: str) -> Iterator[tuple[list[Host], str] | None]:
    """Two network namespaces on a bridge of their own and the DATABASE_URL that reaches the
    server from inside them; None where that cannot be built (not root, no `ip` or `socat`,
    a server that is not on this host). The relay is socat's: tests/ha's Python relay, one
    event loop for eight workers' connections, made claims late enough to miss the rate."""
    url = urlsplit(database_url)
    tools = all(shutil.which(tool) for tool in ("ip", "socat"))
    if os.geteuid() != 0 or not tools or url.hostname not in LOCAL:
        yield None
        return
    # Its own names (by pid) and /24, so an HA run or another run of this test on the
    # machine keeps its network.
    net = TestNetwork(Site(f"lr{os.getpid() % 10000}", free_subnet()))
    try:
        net.__enter__()
        hosts = [net.add_host(name.removeprefix("rate-host-")) for name in HOSTS]
        address, port = net.relay("db", url.port or 5432)
    except (RuntimeError, OSError):
        net.close()
        yield None
        return
    try:
        auth = url.netloc.rpartition("@")[0]
        netloc = f"{auth}@{address}:{port}" if auth else f"{address}:{port}"
        yield hosts, url._replace(netloc=netloc).geturl()
    finally:
        net.close()


def start_on_hosts(
    count: int, env: dict[str, str], log, *, hosts: bool, network: list[Host] | None = None
) -> list[subprocess.Popen]:
    command = [sys.executable, "manage.py", "runworker", "--concurrency", "4"]
    procs = []
    for index in range(count):
        host = HOSTS[index % len(HOSTS)]
        if hosts:
            # A shell in its own UTS namespace names the host, then becomes the worker.
            argv = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *command]
            if network is not None:
                argv = network[index % len(HOSTS)].command(*argv)
        else:
            argv = [*command, "--worker-id", f"{host}:{index}"]
        procs.append(
            subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        )
    return procs


def admitted_at(key: str) -> list[float]:
    stamps = WorkItem.objects.filter(rate_key=key, started_at__isnull=False).values_list(
        "started_at", flat=True
    )
    return sorted(stamp.timestamp() for stamp in stamps)


def busiest_second(stamps: list[float]) -> int:
    most, start = 0, 0
    for end, stamp in enumerate(stamps):
        while stamp - stamps[start] >= 1.0:
            start += 1
        most = max(most, end - start + 1)
    return most


def test_eight_workers_on_two_hosts_admit_fifty_a_second_per_key(subprocess_env, tmp_path):
    enqueue_many(
        [
            {"task_id": f"{key}-{i}", "work_type": "test.noop", "rate_key": key}
            for key in ("hot", "cold")
            for i in range(BACKLOG)
        ]
    )
    hosts = namespaces_allowed()
    limit = {"limit": RATE, "per": 1, "burst": BURST}
    env = {
        **subprocess_env,
        "LEASING_LOG_LEVEL": "WARNING",
        **leasing_env(RATE_LIMITS={"key:*": limit}),
    }
    with (
        network_hosts(subprocess_env["DATABASE_URL"]) as network,
        open(tmp_path / "workers.log", "wb") as log,
    ):
        if network is not None:
            env["DATABASE_URL"] = network[1]
        workers = start_on_hosts(
            8, env, log, hosts=hosts, network=None if network is None else network[0]
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                firsts = [admitted_at(key)[:1] for key in ("hot", "cold")]
                if all(firsts) and time.time() > max(f[0] for f in firsts) + WARM_UP + WINDOW + 1.5:
                    break
                time.sleep(0.5)
        finally:
            stop_workers(workers)
    how = (
        "network namespaces over veth"
        if network is not None and hosts
        else "UTS namespaces"
        if hosts
        else "worker ids only"
    )
    log_text = (tmp_path / "workers.log").read_text(errors="replace")
    hostnames = set(Worker.objects.values_list("hostname", flat=True))
    if hosts:
        assert set(HOSTS) <= hostnames
    for key in ("hot", "cold"):
        stamps = admitted_at(key)
        first = stamps[0]
        start = first + WARM_UP
        in_window = [s for s in stamps if start <= s < start + WINDOW]
        rate = len(in_window) / WINDOW
        print(
            f"\n{key}: {len(in_window)} admitted in {WINDOW:g} s ({rate:.1f}/s, limit {RATE}/s), "
            f"busiest second {busiest_second(stamps)} (burst {BURST}); "
            f"hosts rate-host-a/b ({how}); "
            f"longest gaps {sorted(round(b - a, 3) for a, b in pairwise(in_window))[-5:]}"
        )
        assert abs(rate - RATE) <= 0.05 * RATE, log_text[-3000:]
        assert busiest_second(stamps) <= BURST
        # Nothing waiting on the limit was failed, retried or charged an attempt.
        assert not WorkItem.objects.filter(rate_key=key, retry_count__gt=0).exists()
        assert not WorkItem.objects.filter(rate_key=key, status="failed").exists()
