"""Worker "hosts" as network namespaces on a private test bridge.

    with TestNetwork() as net:
        a = net.add_host("a")          # namespace lha-a, address 198.18.0.11
        net.cut(a); net.heal(a)        # the host's link goes dark / comes back
        net.delay(a, 100)              # 100 ms each way (200 ms round trip)

The bridge `lhabr0` carries 198.18.0.1/24 in the root namespace, where the
test clusters listen; each host is a namespace joined to the bridge by a veth
pair. 198.18.0.0/15 is the range set aside for benchmarking (RFC 2544): it is
never routed, so nothing here can reach, or be reached from, another machine.

Cutting a host sets the root-namespace end of its veth pair down: the host's
packets are dropped without an answer, as on a real partition (no reset, no
"unreachable"), so its open connections hang until their TCP timeouts fire.

A `Site` names the bridge, namespaces and veth ends and picks the /24: the HA
suite's is `HA_SITE` (above); another suite (the rate-limit process test) takes
its own, so the two can run on one machine without removing each other's.

Delay uses `tc qdisc ... netem` when the kernel has it. Kernels built without
sch_netem (some VM kernels) get a relay instead: `delayproxy.py` listens on the
bridge and forwards to the database, holding every chunk for the delay in each
direction; the slowed host connects through it (`db_address()` says where).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .clusters import free_port, run

PREFIX_LEN = 24


@dataclass(frozen=True)
class Site:
    """One test network's names and addresses: `<tag>br0`, `<tag>-NAME`, 198.18.<subnet>.0/24."""

    tag: str  # at most 6 characters: interface names are at most 15
    subnet: int

    @property
    def bridge(self) -> str:
        return f"{self.tag}br0"

    @property
    def ns_prefix(self) -> str:
        return f"{self.tag}-"

    @property
    def gateway(self) -> str:
        return self.address(1)

    def address(self, last: int) -> str:
        return f"198.18.{self.subnet}.{last}"

    def veth(self, index: int, end: str) -> str:
        return f"{self.tag}v{index}{end}"


HA_SITE = Site("lha", 0)
BRIDGE = HA_SITE.bridge
GATEWAY = HA_SITE.gateway
NS_PREFIX = HA_SITE.ns_prefix


@dataclass
class Host:
    name: str  # namespace name
    index: int
    address: str
    veth_root: str  # the end in the root namespace, on the bridge

    def command(self, *cmd: str) -> list[str]:
        """`cmd` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.name, *cmd]


def netem_available() -> bool:
    """Whether this kernel has the netem queueing discipline."""
    probe = "lhaprobe0"
    run("ip", "link", "add", probe, "type", "veth", "peer", "name", "lhaprobe1", check=False)
    try:
        return (
            run(
                "tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms", check=False
            ).returncode
            == 0
        )
    finally:
        run("ip", "link", "del", probe, check=False)


class TestNetwork:
    __test__ = False  # not a pytest test class

    def __init__(self, site: Site = HA_SITE) -> None:
        self.site = site
        self.hosts: dict[str, Host] = {}
        self._relays: dict[str, tuple[subprocess.Popen[bytes], int, int]] = {}
        self._netem: bool | None = None

    def __enter__(self) -> TestNetwork:
        cleanup_network(self.site)
        bridge = self.site.bridge
        try:
            run("ip", "link", "add", bridge, "type", "bridge")
            run("ip", "addr", "add", f"{self.site.gateway}/{PREFIX_LEN}", "dev", bridge)
            run("ip", "link", "set", bridge, "up")
        except BaseException:
            cleanup_network(self.site)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for proc, _port, _target in self._relays.values():
            proc.kill()
            proc.wait(timeout=10)
        self._relays.clear()
        cleanup_network(self.site)
        self.hosts.clear()

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 1
        host = Host(
            name=self.site.ns_prefix + name,
            index=index,
            address=self.site.address(10 + index),
            veth_root=self.site.veth(index, "r"),
        )
        inner = self.site.veth(index, "n")
        run("ip", "netns", "add", host.name)
        run("ip", "link", "add", host.veth_root, "type", "veth", "peer", "name", inner)
        run("ip", "link", "set", inner, "netns", host.name)
        run("ip", "link", "set", host.veth_root, "master", self.site.bridge)
        run("ip", "link", "set", host.veth_root, "up")
        ns = ["ip", "netns", "exec", host.name]
        run(*ns, "ip", "link", "set", "lo", "up")
        run(*ns, "ip", "link", "set", inner, "name", "eth0")
        run(*ns, "ip", "addr", "add", f"{host.address}/{PREFIX_LEN}", "dev", "eth0")
        run(*ns, "ip", "link", "set", "eth0", "up")
        self.hosts[host.name] = host
        self._wait_reachable(host)
        return host

    def _wait_reachable(self, host: Host, timeout: float = 10) -> None:
        """Wait until the bridge forwards the host's port (state 3)."""
        state = Path("/sys/class/net") / host.veth_root / "brport" / "state"
        deadline = time.monotonic() + timeout
        while state.read_text().strip() != "3":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.veth_root} is not forwarding on {self.site.bridge}")
            time.sleep(0.05)

    # --- faults -----------------------------------------------------------------------------

    def cut(self, host: Host) -> None:
        """The host's link goes dark: its packets vanish, no error comes back."""
        run("ip", "link", "set", host.veth_root, "down")

    def heal(self, host: Host) -> None:
        run("ip", "link", "set", host.veth_root, "up")
        self._wait_reachable(host)

    def uses_netem(self) -> bool:
        if self._netem is None:
            self._netem = netem_available()
        return self._netem

    def delay(self, host: Host, one_way_ms: int, *, db_port: int) -> tuple[str, int]:
        """Slow the host's path to the database at `db_port` by `one_way_ms` each way.

        Returns the (address, port) the host must connect to: the database itself
        with netem, the relay without it.
        """
        if self.uses_netem():
            for cmd in (
                [
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    host.veth_root,
                    "root",
                    "netem",
                    "delay",
                    f"{one_way_ms}ms",
                ],
                host.command(
                    "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", f"{one_way_ms}ms"
                ),
            ):
                run(*cmd)
            return self.site.gateway, db_port
        return self.relay(host.name, db_port, delay_ms=one_way_ms)

    def relay(self, key: str, db_port: int, *, delay_ms: int = 0) -> tuple[str, int]:
        """A relay on the bridge to the database at 127.0.0.1:`db_port`, held `delay_ms` each
        way: the (address, port) to connect to. With no delay it is how the hosts reach a
        server that listens on 127.0.0.1 only (and connects from there, as its pg_hba needs).
        """
        port = free_port()
        if delay_ms == 0 and shutil.which("socat"):
            # A process per connection, in C: the Python relay, one event loop for every
            # connection, adds latency a loaded host turns into late claims.
            proc = subprocess.Popen(
                [
                    "socat",
                    f"TCP-LISTEN:{port},bind={self.site.gateway},fork,reuseaddr",
                    f"TCP:127.0.0.1:{db_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self._relays[key] = (proc, port, db_port)
            wait_listening(self.site.gateway, port)
            return self.site.gateway, port
        proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("delayproxy.py")),
                "--listen",
                f"{self.site.gateway}:{port}",
                "--target",
                f"127.0.0.1:{db_port}",
                "--delay-ms",
                str(delay_ms),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert proc.stdout is not None
        ready = proc.stdout.readline()  # the relay prints one line once it listens
        if b"listening" not in ready:
            proc.kill()
            raise RuntimeError(f"delay relay did not start: {ready!r}")
        self._relays[key] = (proc, port, db_port)
        return self.site.gateway, port

    def measure_rtt(self, host: Host, address: str, port: int, dbname: str) -> float:
        """Median seconds of a `SELECT 1` round trip from inside the host."""
        code = (
            "import psycopg,statistics,time\n"
            f"c=psycopg.connect(host='{address}',port={port},user='postgres',dbname='{dbname}',"
            "autocommit=True,connect_timeout=10)\n"
            "c.execute('SELECT 1')\n"
            "r=[]\n"
            "for _ in range(5):\n"
            " t=time.monotonic(); c.execute('SELECT 1').fetchall(); r.append(time.monotonic()-t)\n"
            "print(statistics.median(r))\n"
        )
        out = run(*host.command(sys.executable, "-c", code)).stdout
        return float(out.strip())


def wait_listening(address: str, port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def cleanup_network(site: Site = HA_SITE) -> None:
    """Remove the site's bridge, every one of its namespaces and their veth pairs."""
    out = run("ip", "netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(site.ns_prefix):
            # Processes still inside would keep the namespace alive: the test
            # harness kills its own processes first; this only removes the name.
            run("ip", "netns", "del", name, check=False)
    links = run("ip", "-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        with contextlib.suppress(IndexError):
            link = line.split(":")[1].strip().split("@")[0]
            if (link.startswith(f"{site.tag}v") and link.endswith("r")) or link == site.bridge:
                run("ip", "link", "del", link, check=False)
