"""How far the console's read database is behind the primary (`LEASING["READ_DATABASE"]`).

When the console reads from a streaming replica, every figure it shows is as
old as the replica's last replayed transaction. `replica_lag()` measures that
on the replica itself (`Storage.replication`, PostgreSQL's streaming replication):

* `seconds`: `now() - pg_last_xact_replay_timestamp()`, or 0 when the replica
  has replayed everything the primary wrote (an idle primary commits nothing,
  so the timestamp of the last replayed transaction keeps ageing though
  nothing is missing);
* `bytes`: the primary's `pg_current_wal_lsn()` minus the replica's replayed
  position (WAL the replica has not applied yet), when the primary answers;
  otherwise what the replica received but has not replayed;
* `paused`: replay stopped by `pg_wal_replay_pause()`.

An alias that is not a replica (`pg_is_in_recovery()` false) or not
PostgreSQL has no lag to show: `ReplicaLag.is_replica` / `.measured` say so,
and the page says which. Nothing here writes or decides a write.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..storage import storage_for
from .durations import humanize_seconds


@dataclass(frozen=True, slots=True)
class ReplicaLag:
    """The read database's distance behind the primary."""

    alias: str
    measured: bool  # False: not PostgreSQL, nothing to measure
    is_replica: bool  # pg_is_in_recovery() on the read database
    seconds: float | None  # None: unknown (nothing replayed since the replica started)
    bytes: int | None  # None: unknown
    paused: bool

    @property
    def text(self) -> str:
        """One line for the dashboard."""
        if not self.measured:
            return f"read database {self.alias!r} is not PostgreSQL: lag not measured"
        if not self.is_replica:
            return f"read database {self.alias!r} is not a replica: no lag"
        parts = [
            "unknown" if self.seconds is None else humanize_seconds(self.seconds),
        ]
        if self.bytes is not None:
            parts.append(f"{self.bytes:,} bytes of WAL")
        if self.paused:
            parts.append("replay paused")
        return " · ".join(parts)


def parse_lsn(value: str | None) -> int | None:
    """`16/B374D848` as an integer (WAL bytes from the start); None stays None."""
    if not value or "/" not in value:
        return None
    high, low = value.split("/", 1)
    try:
        return (int(high, 16) << 32) + int(low, 16)
    except ValueError:
        return None


def _primary_lsn(primary: str) -> int | None:
    """The primary's WAL end, or None when it has none or does not answer (the
    replica's figure alone is still worth showing if the primary is down)."""
    return parse_lsn(storage_for(primary).wal_end())


def replica_lag(using: str, *, primary: str = "default") -> ReplicaLag:
    """Measure how far `using` (the read database) is behind `primary`."""
    replication = storage_for(using).replication()
    if replication is None:
        return ReplicaLag(using, False, False, None, None, False)
    in_recovery, replayed, received, age, paused = replication
    if not in_recovery:
        return ReplicaLag(using, True, False, 0.0, 0, False)
    replay_lsn = parse_lsn(replayed)
    end_lsn = _primary_lsn(primary) if primary != using else None
    if end_lsn is None:
        end_lsn = parse_lsn(received)
    behind = None
    if end_lsn is not None and replay_lsn is not None:
        behind = max(0, end_lsn - replay_lsn)
    seconds = None if age is None else max(0.0, float(age))
    if behind == 0:
        seconds = 0.0  # everything written is replayed: the data is current
    return ReplicaLag(using, True, True, seconds, behind, paused)
