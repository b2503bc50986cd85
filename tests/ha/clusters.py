"""Throwaway PostgreSQL clusters on spare loopback ports, made with Debian's tools.

    primary = Cluster.create_primary("fo_p")
    standby = Cluster.create_standby(primary, "fo_s", synchronous=True)
    ...
    standby.drop(); primary.drop()

Every cluster is named `<PREFIX><name>` (`lha_` for the HA suite) so that
`drop_leftovers()` can remove one a crashed run left behind. Clusters trust
every local and test-namespace client: they only ever listen on loopback and on
the test bridge.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

VERSION = "15"
ETC = Path("/etc/postgresql") / VERSION
DATA = Path("/var/lib/postgresql") / VERSION
# Who makes this process's clusters: the HA suite, or the fault run (its conftest
# sets LEASING_CLUSTER_OWNER=faults). .ci/run runs the two at once, so each names
# its clusters and pgbouncer directories with its own prefix and takes ports from
# its own range: the HA suite's removal of leftovers (`lha_*`) never touches the
# fault run's cluster or pooler. Spare ports, away from 5432 and the ephemeral range.
OWNERS = {
    "ha": ("lha_", range(55400, 55900)),
    "faults": ("lfx_", range(55900, 56400)),
}
PREFIX, PORT_RANGE = OWNERS[os.environ.get("LEASING_CLUSTER_OWNER", "ha")]


def run(*cmd: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise with its output in the message."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def as_postgres(*cmd: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run("runuser", "-u", "postgres", "--", *cmd, timeout=timeout)


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_taken: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on (and that this run has not handed out)."""
    for port in PORT_RANGE:
        if port not in _taken and port_is_free(port):
            _taken.add(port)
            return port
    raise RuntimeError(f"no free port in {PORT_RANGE}")


def _existing_clusters() -> list[str]:
    out = run("pg_lsclusters", "--no-header", check=False).stdout
    return [
        line.split()[1]
        for line in out.splitlines()
        if line.split() and line.split()[0] == VERSION and line.split()[1].startswith(PREFIX)
    ]


@dataclass
class Cluster:
    name: str  # full cluster name, with the prefix
    port: int
    listen: tuple[str, ...] = ("127.0.0.1",)
    dbname: str = "leasing_ha"
    _killed: bool = field(default=False, repr=False)

    # --- creation ----------------------------------------------------------------------

    @classmethod
    def create_primary(
        cls,
        name: str,
        *,
        listen: tuple[str, ...] = ("127.0.0.1",),
        settings: dict[str, str] | None = None,
        dbname: str = "leasing_ha",
    ) -> Cluster:
        cluster = cls(PREFIX + name, free_port(), listen, dbname)
        try:
            cluster._create_empty()
            cluster._configure(settings or {})
            cluster.start()
            cluster.execute(f'CREATE DATABASE "{dbname}"', dbname="postgres")
        except BaseException:
            cluster.drop()
            raise
        return cluster

    @classmethod
    def create_standby(
        cls,
        primary: Cluster,
        name: str,
        *,
        synchronous: bool = False,
        settings: dict[str, str] | None = None,
    ) -> Cluster:
        """A streaming standby of `primary` (pg_basebackup); `synchronous` makes
        the primary wait for it on every commit."""
        standby = cls(PREFIX + name, free_port(), primary.listen, primary.dbname)
        try:
            standby._create_empty()
            for child in standby.datadir.iterdir():
                run("rm", "-rf", str(child))
            as_postgres(
                "pg_basebackup",
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                "postgres",
                "-D",
                str(standby.datadir),
                "-X",
                "stream",
                "-c",
                "fast",
            )
            (standby.datadir / "standby.signal").touch()
            run("chown", "postgres:postgres", str(standby.datadir / "standby.signal"))
            standby._configure(
                {
                    "primary_conninfo": (
                        f"'host=127.0.0.1 port={primary.port} user=postgres "
                        f"application_name={standby.name}'"
                    ),
                    "hot_standby": "on",
                    "hot_standby_feedback": "on",
                    **(settings or {}),
                }
            )
            standby.start()
            standby.wait_streaming(primary)
            if synchronous:
                primary.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{standby.name}'")
                primary.execute("SELECT pg_reload_conf()")
                standby.wait_streaming(primary, sync_state="sync")
        except BaseException:
            standby.drop()
            raise
        return standby

    def _create_empty(self) -> None:
        run(
            "pg_createcluster",
            VERSION,
            self.name,
            "-p",
            str(self.port),
            "--start-conf",
            "manual",
            "--",
            "--auth=trust",
        )

    def _configure(self, settings: dict[str, str]) -> None:
        base = {
            "listen_addresses": "'" + ",".join(self.listen) + "'",
            "timezone": "'UTC'",
            "max_connections": "200",
            "shared_buffers": "128MB",
            # Fast, small WAL for throwaway clusters; durability stays on
            # (fsync on) because failover correctness depends on it.
            "wal_keep_size": "256MB",
            "log_min_messages": "warning",
            "log_line_prefix": "'%m [%p] %a '",
        }
        lines = [f"{key} = {value}" for key, value in {**base, **settings}.items()]
        self._write(ETC / self.name / "conf.d" / "lha.conf", "\n".join(lines) + "\n")
        hba = [
            "local all all trust",
            "host all all 127.0.0.1/32 trust",
            "host all all 198.18.0.0/24 trust",
            "local replication all trust",
            "host replication all 127.0.0.1/32 trust",
        ]
        self._write(ETC / self.name / "pg_hba.conf", "\n".join(hba) + "\n")

    @staticmethod
    def _write(path: Path, text: str) -> None:
        path.write_text(text)
        run("chown", "postgres:postgres", str(path))

    # --- life cycle ----------------------------------------------------------------------

    @property
    def datadir(self) -> Path:
        return DATA / self.name

    @property
    def logfile(self) -> Path:
        return Path("/var/log/postgresql") / f"postgresql-{VERSION}-{self.name}.log"

    def start(self) -> None:
        run("pg_ctlcluster", "--skip-systemctl-redirect", VERSION, self.name, "start")
        self._killed = False
        self.wait_ready()

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.execute("SELECT 1", dbname="postgres")
                return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.datadir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> float:
        """SIGKILL the postmaster and every backend at once, as if the host died.

        Returns the monotonic time of the kill.
        """
        pid = self.postmaster_pid()
        if pid is None:
            raise RuntimeError(f"{self.name} is not running")
        victims = [pid, *_children(pid)]
        at = time.time()
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        self._killed = True
        return at

    def promote(self) -> None:
        self.execute("SELECT pg_promote(wait => true, wait_seconds => 30)", dbname="postgres")

    def drop(self) -> None:
        """Stop and remove the cluster; works on a half-made or killed one too."""
        pid = self.postmaster_pid()
        if pid is not None and _alive(pid):
            run(
                "pg_ctlcluster",
                "--skip-systemctl-redirect",
                VERSION,
                self.name,
                "stop",
                "-m",
                "immediate",
                check=False,
            )
        drop_cluster(self.name)

    # --- queries ---------------------------------------------------------------------------

    def dsn(self, dbname: str | None = None) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname or self.dbname}"

    def connect(self, dbname: str | None = None, **kwargs: object) -> psycopg.Connection:
        return psycopg.connect(self.dsn(dbname), autocommit=True, connect_timeout=5, **kwargs)

    def execute(self, sql: str, params: tuple = (), *, dbname: str | None = None) -> list[tuple]:
        with self.connect(dbname) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def wait_streaming(
        self, primary: Cluster, *, sync_state: str | None = None, timeout: float = 60
    ) -> None:
        deadline = time.monotonic() + timeout
        while True:
            rows = primary.execute(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                (self.name,),
                dbname="postgres",
            )
            if rows and rows[0][0] == "streaming" and sync_state in (None, rows[0][1]):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} is not streaming from {primary.name}: {rows}")
            time.sleep(0.2)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def drop_cluster(name: str) -> None:
    """pg_dropcluster, and if that fails, kill what is left and remove the files."""
    if not name.startswith(PREFIX):
        raise ValueError(f"refusing to drop {name!r}: not a test cluster")
    proc = run("pg_dropcluster", "--stop", VERSION, name, check=False)
    if proc.returncode == 0:
        return
    pidfile = DATA / name / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int(pidfile.read_text().split()[0])
        for victim in [pid, *_children(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        time.sleep(0.5)
    run("pg_dropcluster", VERSION, name, check=False)
    run("rm", "-rf", str(DATA / name), str(ETC / name), check=False)


def drop_leftovers() -> list[str]:
    """Remove every cluster of this owner's prefix (a crashed earlier run's); return their names."""
    names = _existing_clusters()
    for name in names:
        drop_cluster(name)
    return names
