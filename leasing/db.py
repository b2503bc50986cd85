"""The small SQL dialect layer the service modules share.

The hot paths (claim, renew, release, sweep) are single conditional UPDATE
statements with RETURNING, written by hand so that each is one round trip and
its fencing condition is visible in one place. This module gives them the
database clock in each dialect, JSON and datetime conversion for rows read
through a raw cursor, and the translation of connection failures.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import InterfaceError, OperationalError, connections
from django.utils.dateparse import parse_datetime

from .exceptions import DatabaseUnavailable

# SQLite keeps datetimes as ISO text in UTC; 'now' is the same for a whole
# statement, like PostgreSQL's statement_timestamp(). `%%` because Django runs
# every statement here through parameter substitution.
_SQLITE_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


class Dialect:
    """SQL fragments for one database connection's vendor."""

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self.vendor = connections[using].vendor
        self.is_postgres = self.vendor == "postgresql"
        if self.vendor not in ("postgresql", "sqlite"):
            # Other backends lack SKIP LOCKED semantics or RETURNING the way the
            # services use them; failing loudly beats silently double-claiming.
            from .exceptions import LeasingConfigurationError

            raise LeasingConfigurationError(
                f"The leasing app supports PostgreSQL and SQLite, not {self.vendor!r}."
            )

    @property
    def now(self) -> str:
        """The database clock, fixed for the statement."""
        return "statement_timestamp()" if self.is_postgres else _SQLITE_NOW

    def now_plus(self) -> str:
        """The database clock plus a number of seconds given as one parameter."""
        if self.is_postgres:
            return "(statement_timestamp() + make_interval(secs => %s))"
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"

    def now_minus(self) -> str:
        """The database clock minus a number of seconds given as one parameter."""
        if self.is_postgres:
            return "(statement_timestamp() - make_interval(secs => %s))"
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"

    def seconds(self, seconds: float, sign: int = 1) -> Any:
        """The parameter for `now_plus()` (sign=1) or `now_minus()` (sign=-1)."""
        if self.is_postgres:
            return float(seconds)
        return f"{'+' if sign > 0 else '-'}{float(seconds):.6f} seconds"

    def datetime_param(self, value: datetime | None) -> Any:
        """A datetime as this database compares it (naive UTC text on SQLite)."""
        if value is None or self.is_postgres:
            return value
        return connections[self.using].ops.adapt_datetimefield_value(value)

    def json_param(self) -> str:
        return "%s::jsonb" if self.is_postgres else "%s"

    def in_list(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """`column IN (...)` for a non-empty list of values."""
        if self.is_postgres:
            return f"{column} = ANY(%s)", [list(values)]
        placeholders = ", ".join(["%s"] * len(values))
        return f"{column} IN ({placeholders})", list(values)

    def skip_locked(self) -> str:
        return "FOR UPDATE SKIP LOCKED" if self.is_postgres else ""


def dump_json(value: Any) -> str | None:
    """Encode a payload for a raw JSON parameter (`None` stays SQL NULL)."""
    if value is None:
        return None
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def load_json(value: Any) -> Any:
    """Decode a JSON column read through a raw cursor."""
    if isinstance(value, str | bytes | bytearray):
        return json.loads(value)
    return value


def to_datetime(value: Any) -> datetime | None:
    """An aware UTC datetime from a timestamp column read through a raw cursor."""
    if value is None:
        return None
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError(f"unparseable timestamp {value!r}")
        value = parsed
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def fetch_dicts(cursor: Any, description: Any = None) -> list[dict[str, Any]]:
    # psycopg builds `description` anew on every access: read it once.
    columns = [col[0] for col in description or cursor.description]
    return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def execute(using: str, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
    """Run one statement and return its rows (RETURNING or SELECT) as dicts."""
    with translate_db_errors(), connections[using].cursor() as cursor:
        cursor.execute(sql, list(params))
        description = cursor.description
        if description is None:
            return []
        return fetch_dicts(cursor, description)


def database_now(using: str = "default") -> datetime:
    """The database clock, as an aware datetime."""
    dialect = Dialect(using)
    rows = execute(using, f"SELECT {dialect.now} AS now")
    now = to_datetime(rows[0]["now"])
    assert now is not None
    return now


@contextlib.contextmanager
def translate_db_errors() -> Iterator[None]:
    """Turn a dropped or refused connection into `DatabaseUnavailable`.

    Only connection-level failures are translated: a deadlock, a lock timeout
    or a bad statement stays the `DatabaseError` it is, so it is not mistaken
    for an outage in the logs and in the callers' retry loops.
    """
    try:
        yield
    except InterfaceError as exc:
        raise DatabaseUnavailable(f"Database unavailable: {exc}") from exc
    except OperationalError as exc:
        if is_connection_error(exc):
            raise DatabaseUnavailable(f"Database unavailable: {exc}") from exc
        raise


# SQLSTATE classes of a lost or refused connection: 08 (connection exception)
# and the server shutting down or refusing to start one.
_CONNECTION_SQLSTATES = ("08", "57P01", "57P02", "57P03")
_SQLITE_UNAVAILABLE = ("unable to open", "disk i/o error", "database is locked")


# SQLSTATEs of a statement PostgreSQL aborted to break a lock conflict: deadlock
# detected, serialization failure. Running it again is the standard remedy.
_CONFLICT_SQLSTATES = ("40P01", "40001")


def is_transient_conflict(exc: BaseException) -> bool:
    """Whether the statement was aborted by a deadlock or serialization failure."""
    cause = exc.__cause__ or exc
    return getattr(cause, "sqlstate", None) in _CONFLICT_SQLSTATES


def is_connection_error(exc: BaseException) -> bool:
    """Whether a driver error means the database is unreachable, not the statement wrong."""
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", "missing")
    if sqlstate != "missing":  # psycopg
        # No SQLSTATE: the server never answered (refused, reset, timed out).
        return sqlstate is None or str(sqlstate).startswith(_CONNECTION_SQLSTATES)
    message = str(cause).lower()
    if any(marker in message for marker in _SQLITE_UNAVAILABLE):
        return True
    # psycopg errors raised before reaching a server carry no SQLSTATE attribute
    # value; anything else from a driver we do not know is treated as an outage.
    return type(cause).__module__.split(".")[0] not in ("sqlite3",)
