"""pgbouncer in transaction mode in front of a test cluster.

    with PgBouncer(cluster, pool_size=10) as bouncer:
        bouncer.port            # clients connect here
        bouncer.show("POOLS")   # the admin console's view

pgbouncer refuses to run as root, so it runs as `postgres`; its files live in
a temporary directory that is removed when it stops.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from .clusters import PREFIX, Cluster, free_port, run

# `lha-pgbouncer-*` for the HA suite, `lfx-pgbouncer-*` for the fault run (clusters.OWNERS).
DIR_PREFIX = PREFIX.rstrip("_") + "-pgbouncer-"
PIDFILE_GLOB = f"/tmp/{DIR_PREFIX}*/pgbouncer.pid"


class PgBouncer:
    def __init__(
        self,
        cluster: Cluster,
        *,
        pool_size: int = 10,
        listen: tuple[str, ...] = ("127.0.0.1",),
        max_client_conn: int = 2000,
    ) -> None:
        self.cluster = cluster
        self.pool_size = pool_size
        self.listen = listen
        self.max_client_conn = max_client_conn
        self.port = free_port()
        self.dir: Path | None = None
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> PgBouncer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
        db = self.cluster.dbname
        (self.dir / "userlist.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"{db} = host=127.0.0.1 port={self.cluster.port} dbname={db}",
                    "[pgbouncer]",
                    f"listen_addr = {','.join(self.listen)}",
                    f"listen_port = {self.port}",
                    f"unix_socket_dir = {self.dir}",
                    "auth_type = trust",
                    f"auth_file = {self.dir / 'userlist.txt'}",
                    "admin_users = postgres",
                    "pool_mode = transaction",
                    f"default_pool_size = {self.pool_size}",
                    "min_pool_size = 0",
                    "reserve_pool_size = 0",
                    f"max_client_conn = {self.max_client_conn}",
                    f"max_db_connections = {self.pool_size}",
                    # psycopg sends none of these, but other drivers do.
                    "ignore_startup_parameters = extra_float_digits,options",
                    f"pidfile = {self.dir / 'pgbouncer.pid'}",
                    f"logfile = {self.dir / 'pgbouncer.log'}",
                    "log_connections = 0",
                    "log_disconnections = 0",
                    "",
                ]
            )
        )
        run("chown", "-R", "postgres:postgres", str(self.dir))
        self.proc = subprocess.Popen(
            ["runuser", "-u", "postgres", "--", "pgbouncer", str(self.dir / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                with self.connect():
                    return
            except psycopg.Error:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{self.log()}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # runuser forwards SIGTERM to pgbouncer, which then exits.
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._kill_by_pidfile()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _kill_by_pidfile(self) -> None:
        if self.dir is None:
            return
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.dir / "pgbouncer.pid").read_text().strip())
            run("kill", "-KILL", str(pid), check=False)

    def log(self) -> str:
        if self.dir is None:
            return ""
        with contextlib.suppress(OSError):
            return (self.dir / "pgbouncer.log").read_text()[-4000:]
        return ""

    def connect(self, dbname: str | None = None) -> psycopg.Connection:
        # prepare_threshold=None: the pooler cannot keep a prepared statement.
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            dbname=dbname or self.cluster.dbname,
            autocommit=True,
            connect_timeout=5,
            prepare_threshold=None,
        )

    def show(self, what: str) -> list[dict[str, Any]]:
        """`SHOW <what>` on the admin console (POOLS, STATS, CLIENTS, SERVERS)."""
        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            dbname="pgbouncer",
            autocommit=True,
            connect_timeout=5,
            cursor_factory=psycopg.ClientCursor,
        ) as conn:
            # The admin console speaks only the simple query protocol.
            cur = conn.execute(f"SHOW {what}".encode())
            cols = [c.name for c in cur.description or []]
            return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def kill_leftover_pgbouncers() -> None:
    """Stop pgbouncers a crashed earlier run left (found by their pid files)."""
    import glob

    for pidfile in glob.glob(PIDFILE_GLOB):
        with contextlib.suppress(OSError, ValueError):
            pid = int(Path(pidfile).read_text().strip())
            run("kill", "-KILL", str(pid), check=False)
        shutil.rmtree(Path(pidfile).parent, ignore_errors=True)
