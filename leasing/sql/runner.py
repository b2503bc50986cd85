"""Running catalogue statements: rows as dicts, values decoded, driver errors classified.

A statement is `(sql, params)`. `run()` executes one and returns its rows
(RETURNING or SELECT). Driver errors are sorted into three kinds the callers
treat differently:

* an outage (connection refused, dropped, server shutting down, or a driver
  that lost track of the protocol): raised as `DatabaseUnavailable`, the
  caller reconnects and tries again;
* a lock conflict (deadlock, serialization failure, lock timeout, SQLite's
  "database is locked"): the statement changed nothing; run it again;
* anything else (a bad statement, a value the column refuses): a real error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import (
    DatabaseError,
    InterfaceError,
    InternalError,
    OperationalError,
    connections,
    transaction,
)
from django.utils.dateparse import parse_datetime

from ..exceptions import DatabaseUnavailable, one_line
from ..storage import storage_of_error

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from ..storage.base import Storage


Statement = tuple[str, list[Any]]
logger = logging.getLogger("leasing")

# How many times a process's start waits out an outage: about two minutes in all.
START_ATTEMPTS = 30


def run(using: str, statement: Statement) -> list[dict[str, Any]]:
    """Execute one statement and return its rows as dicts."""
    with _executed(using, statement) as (cursor, _storage):
        # psycopg builds `description` anew on every access: read it once.
        description = cursor.description
        if description is None:
            return []
        columns = [col[0] for col in description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def run_rows(using: str, statement: Statement) -> list[tuple[Any, ...]]:
    """Execute one statement; returns its rows as tuples, for callers that read by position.

    The claim's hot path: a dict a row costs more than the rest of a no-op
    item's claim, and on PostgreSQL the column names are never even built
    (psycopg makes an object per column each time it is asked for them).
    """
    with _executed(using, statement) as (cursor, storage):
        # Through Django's wrapper, which turns driver errors into Django's
        # (translate_db_errors tells an outage by them).
        return cursor.fetchall() if storage.has_rows(cursor) else []


@contextlib.contextmanager
def _executed(using: str, statement: Statement) -> Iterator[tuple[Any, Storage]]:
    """A cursor that has run `statement` and stands on its result set with rows, if any."""
    from ..storage import storage_for

    sql, params = statement
    storage = storage_for(using)
    with translate_db_errors(), storage.connection.cursor() as cursor:
        storage.prepare(cursor)
        cursor.execute(sql, params)
        storage.next_result_with_rows(cursor)
        yield cursor, storage


def run_each(using: str, statements: Iterable[Statement]) -> list[dict[str, Any]]:
    """Run statements in one transaction; returns all their rows (for per-row SQLite writes)."""
    with transaction.atomic(using=using):
        return [row for statement in statements for row in run(using, statement)]


def run_one(using: str, statement: Statement) -> dict[str, Any] | None:
    rows = run(using, statement)
    return rows[0] if rows else None


@contextlib.contextmanager
def translate_db_errors() -> Iterator[None]:
    """Turn a dropped or refused connection into `DatabaseUnavailable`.

    Only connection-level failures are translated: a deadlock, a lock timeout
    or a bad statement stays the `DatabaseError` it is.
    """
    try:
        yield
    except InterfaceError as exc:
        raise DatabaseUnavailable(f"Database unavailable: {exc}") from exc
    except OperationalError as exc:
        if is_connection_error(exc):
            raise DatabaseUnavailable(f"Database unavailable: {exc}") from exc
        raise
    except InternalError as exc:
        if lost_protocol(exc):
            raise DatabaseUnavailable(f"Database unavailable: {exc}") from exc
        raise


def _cause(exc: BaseException) -> BaseException:
    return exc.__cause__ or exc


def is_lock_conflict(exc: BaseException) -> bool:
    """The statement was aborted by a lock conflict and changed nothing: run it again."""
    cause = _cause(exc)
    driver = storage_of_error(cause)
    return driver is not None and driver.is_lock_conflict(cause)


def is_connection_error(exc: BaseException) -> bool:
    """Whether a driver error means the database is unreachable, not the statement wrong."""
    if isinstance(exc, DatabaseUnavailable | InterfaceError):
        return True
    cause = _cause(exc)
    driver = storage_of_error(cause)
    # An error from a driver we do not know is treated as an outage.
    return driver is None or driver.is_unavailable(cause)


# How many times a statement that met a concurrent holder of a unique key is
# run again (each run sees the holders committed before it started).
UNIQUE_RACE_ATTEMPTS = 3


def is_unique_violation(exc: BaseException, index: str, columns: str) -> bool:
    """The statement broke the unique index `index` on `columns` ("table.a, table.b")."""
    cause = _cause(exc)
    driver = storage_of_error(cause)
    return driver is not None and driver.breaks_unique(cause, index, columns)


def lost_protocol(exc: BaseException) -> bool:
    """The driver lost track of the conversation, with no error from the server.

    psycopg raises `InternalError` with no SQLSTATE when the answers it reads
    do not fit what it sent ("received 2 results from command 'COMMIT'", seen
    after a pooler's server connection crashed): what the server did is
    unknown, so it is treated as an outage, never as the statement's fault.
    """
    if not isinstance(exc, InternalError):
        return False
    cause = _cause(exc)
    driver = storage_of_error(cause)
    return driver is not None and driver.is_unavailable(cause)


def is_infrastructure_error(exc: BaseException) -> bool:
    """An outage or a lock conflict: the database's trouble, not the caller's code."""
    if isinstance(exc, DatabaseUnavailable | InterfaceError):
        return True
    if isinstance(exc, OperationalError):
        return is_lock_conflict(exc) or is_connection_error(exc)
    return lost_protocol(exc)


def until_reachable[T](
    fn: Callable[[], T],
    *,
    what: str,
    using: str,
    stop: threading.Event,
    attempts: int = START_ATTEMPTS,
) -> T:
    """Run `fn`, waiting out an outage with a growing pause (up to 5 s).

    A long-running command started before its database answers (PostgreSQL
    restarting, a pooler not up yet) waits instead of exiting, so a process
    manager's limit on quick restarts (systemd's `StartLimitBurst`) is not
    spent on it. Raises the outage after `attempts`, or at once when `stop`
    is set; any other error at once.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except (DatabaseUnavailable, DatabaseError) as exc:
            if not is_infrastructure_error(exc) or attempt == attempts - 1 or stop.is_set():
                raise
            logger.warning("%s failed (%s); retrying", what, one_line(exc))
            close_connection(using)
            stop.wait(min(0.2 * 2**attempt, 5.0))
    raise AssertionError("unreachable: the last attempt returns or raises")


def dump_json(value: Any) -> str | None:
    """Encode a payload for a raw JSON parameter (`None` stays SQL NULL)."""
    if value is None:
        return None
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


_JSON_TEXT = (str, bytes, bytearray)


def load_json(value: Any) -> Any:
    """Decode a JSON column read through a raw cursor."""
    if isinstance(value, _JSON_TEXT):
        return json.loads(value)
    return value


def to_datetime(value: Any) -> datetime | None:
    """An aware UTC datetime from a timestamp column read through a raw cursor."""
    if value is None:
        return None
    moment: datetime
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError(f"unparseable timestamp {value!r}")
        moment = parsed
    else:
        moment = value  # the driver's datetime
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    if moment.tzinfo is not UTC:  # a session time zone other than UTC
        return moment.astimezone(UTC)
    return moment


def database_now(using: str = "default") -> datetime:
    """The database clock, as an aware datetime."""
    from ..storage import storage_for

    row = run_one(using, (f"SELECT {storage_for(using).now} AS now", []))
    now = to_datetime(row["now"] if row else None)
    assert now is not None
    return now


def close_connection(using: str) -> None:
    """Drop this thread's connection (it may be broken) so the next query reconnects.

    Inside an atomic block the owner of the transaction decides; closing
    there would hide its error.
    """
    connection = connections[using]
    if connection.in_atomic_block:
        return
    with contextlib.suppress(Exception):  # closing a dead connection can itself fail
        connection.close()


# A connection idle this long is checked (SELECT 1) before new work gets it,
# as Django checks one per request.
IDLE_CHECK_SECONDS = 1.0


class HangUpWatch:
    """Whether the server hung up on one thread's idle connection: one poll of its socket.

    A backend the server ends (`pg_terminate_backend`, a restart or failover,
    `idle_session_timeout`) sends its reason and closes, so the socket of an idle
    connection becomes readable, while a handler that sleeps or works without
    the database holds it. The poll is kept while the driver's connection is
    the same. SQLite (no socket) and platforms without `poll` never tell.
    """

    __slots__ = ("_poll", "_raw")

    def __init__(self) -> None:
        self._raw: Any = None
        self._poll: Any = None

    def hung_up(self, raw: Any) -> bool:
        if raw is not self._raw:
            self._raw, self._poll = raw, None
            fileno = getattr(raw, "fileno", None)
            if fileno is None or not hasattr(select, "poll"):
                return False
            try:
                fd = fileno()
            except Exception:  # psycopg: "the connection is lost"
                return True
            self._poll = select.poll()
            self._poll.register(fd, select.POLLIN)
        if self._poll is None:
            return False
        try:
            return bool(self._poll.poll(0))
        except OSError:
            return True


def refresh_connection(connection: BaseDatabaseWrapper, watch: HangUpWatch, idle: bool) -> None:
    """Before new work gets this thread's connection: drop it if the server did.

    Checked (SELECT 1) after a query on it failed, after it sat `idle`, or when
    the server spoke on it unasked (`HangUpWatch`), so that a handler's first
    query does not fail, and its run is not interrupted, on a connection that
    died while nothing used it. A transaction still open on it (the executor
    rolls back what a handler leaves, `end_left_transactions`) is rolled back first.
    """
    if _left_in_transaction(connection):
        logger.warning("rolled back a transaction left open on database %r", connection.alias)
        _reset_transaction(connection)
    raw = connection.connection
    if raw is None:
        return
    if connection.errors_occurred or idle or watch.hung_up(raw):
        if not connection.is_usable():
            close_connection(connection.alias)
        else:
            connection.close_if_unusable_or_obsolete()


class TransactionLeftOpen(RuntimeError):
    """A handler returned with a transaction still open (an atomic block it never exited,
    or autocommit it turned off): the worker rolled it back, so the writes in it are lost."""

    @classmethod
    def on(cls, aliases: list[str]) -> TransactionLeftOpen:
        names = ", ".join(repr(alias) for alias in aliases)
        return cls(
            f"the handler left a transaction open on database {names} (an atomic block "
            "it never exited, or autocommit turned off); it was rolled back, so the writes "
            "it made in that transaction are lost"
        )


def end_left_transactions() -> list[str]:
    """Roll back any transaction left open on this thread's connections; returns their aliases.

    After a handler, its thread's connections must be as Django leaves them after
    a request: otherwise the next run's writes join a transaction nobody commits,
    and the locks it takes hold up every other process until the worker is killed.
    Never raises: a connection it cannot reset is closed (the next query reconnects).
    """
    left = []
    for connection in connections.all(initialized_only=True):
        if _left_in_transaction(connection):
            left.append(connection.alias)
            _reset_transaction(connection)
    return left


def _left_in_transaction(connection: BaseDatabaseWrapper) -> bool:
    if connection.in_atomic_block:
        return True
    # Autocommit turned off outside `atomic()` (`set_autocommit(False)`): the driver
    # opens a transaction on the next statement and keeps it open.
    return (
        connection.connection is not None
        and connection.autocommit != connection.settings_dict["AUTOCOMMIT"]
    )


def _reset_transaction(connection: BaseDatabaseWrapper) -> None:
    """Forget the atomic blocks nobody will exit, roll back, restore autocommit.

    Django resets this state only when it opens a new connection (`connect()`),
    and refuses `rollback()`, `set_autocommit()` and `close()` inside an atomic
    block; the attributes below are the ones `connect()` resets.
    """
    connection.in_atomic_block = False
    connection.atomic_blocks.clear()
    connection.savepoint_ids.clear()
    connection.needs_rollback = False
    connection.run_on_commit.clear()  # their transaction never commits: they must not run
    if connection.closed_in_transaction:
        # Closed inside the block: the server ended the transaction; only the wrapper
        # still holds the closed driver connection.
        connection.closed_in_transaction = False
        _drop(connection)
        return
    try:
        connection.rollback()
        connection.set_autocommit(connection.settings_dict["AUTOCOMMIT"])
    except Exception:  # a broken connection: closing it ends its transaction too
        _drop(connection)


def _drop(connection: BaseDatabaseWrapper) -> None:
    with contextlib.suppress(Exception):
        connection.close()
    connection.connection = None  # even if closing failed: the next query reconnects
