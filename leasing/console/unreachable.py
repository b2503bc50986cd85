"""Which database a console page could not read, and why, in one line.

A console page reads `leasing.conf.read_alias()` (`LEASING["READ_DATABASE"]`,
often a streaming replica) and, for a few figures, the primary. When one of
them does not answer (connection refused, a file that cannot be opened, a
dropped connection), `unreachable(exc)` names the alias whose connection
raised and the driver's one-line reason. A read-only page (`read_only=True`:
GET, HEAD, `/metrics`) whose query PostgreSQL cancelled on purpose
(`statement_timeout`, `lock_timeout`, a conflict with recovery on a replica,
`pg_cancel_backend`: `is_cancelled`) is answered the same way, as
`cancelled`, and so is one that read a database without leasing's tables or
columns of this version (`unmigrated`: a READ_DATABASE that is no replica of
the primary, or migrations not applied); a page that writes keeps such an
error, since part of what it did may have been committed. Any other error
(a bad statement) stays the error it is. The admin answers with a 503 page
(`leasing.admin.views.unreachable`) and `/metrics` with a 503 line: never a
traceback, and never figures read from another database instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from ..conf import WRITE_DATABASE, read_alias
from ..exceptions import DatabaseUnavailable, one_line
from ..sql.runner import is_connection_error, lost_protocol
from ..storage import storage_of_error

# PostgreSQL's SQLSTATEs for a statement it cancelled on purpose: query_canceled
# (statement_timeout, pg_cancel_backend, some conflicts with recovery), lock_not_available
# (lock_timeout), and the serialization failure and deadlock a standby raises for a conflict
# with recovery. SQLite's errors carry no SQLSTATE: none of them is a cancellation.
CANCELLED_SQLSTATES = frozenset({"57014", "55P03", "40001", "40P01"})


@dataclass(frozen=True, slots=True)
class Unreachable:
    """A database that did not answer a page's read, or cancelled it (`cancelled`)."""

    alias: str
    reason: str  # the driver's error, one line
    read_database: bool  # the alias is LEASING["READ_DATABASE"], not the primary
    cancelled: bool = False  # the server answered, and cancelled the query on purpose
    unmigrated: bool = False  # the server answered: it lacks a table or column of leasing's

    @property
    def text(self) -> str:
        """One line for `/metrics` and logs: which database, why, what to do."""
        if self.cancelled:
            which = (
                f"The read database {self.alias!r} (LEASING['READ_DATABASE'])"
                if self.read_database
                else f"The database {self.alias!r}"
            )
            return (
                f"{which} cancelled this page's query (statement_timeout / lock_timeout / a "
                f"conflict with recovery on the replica): {self.reason}. Try again; if it "
                "repeats, raise the timeout for the console's role."
            )
        if self.unmigrated:
            if self.read_database:
                return (
                    f"The read database {self.alias!r} (LEASING['READ_DATABASE']) lacks "
                    f"leasing's tables of this version: {self.reason}. Point it at a replica "
                    f"of the primary ({WRITE_DATABASE!r}), or remove READ_DATABASE from LEASING."
                )
            return (
                f"The database {self.alias!r} lacks leasing's tables of this version: "
                f"{self.reason}. Run `python manage.py migrate`."
            )
        if self.read_database:
            return (
                f"The read database {self.alias!r} (LEASING['READ_DATABASE']) is unreachable: "
                f"{self.reason}. Bring it back, or remove READ_DATABASE from LEASING to read "
                f"the primary ({WRITE_DATABASE!r})."
            )
        return f"The database {self.alias!r} is unreachable: {self.reason}."


def is_outage(exc: BaseException) -> bool:
    """The database did not answer, as `sql.runner.translate_db_errors` tells it."""
    if isinstance(exc, DatabaseUnavailable | InterfaceError):
        return True
    if isinstance(exc, OperationalError):
        return is_connection_error(exc)
    return lost_protocol(exc)


def is_cancelled(exc: BaseException) -> bool:
    """PostgreSQL cancelled the statement on purpose; read from the SQLSTATE of the
    driver's error Django wraps, as `sql.runner.is_connection_error` reads it."""
    if not isinstance(exc, DatabaseError):
        return False
    cause = exc.__cause__ or exc
    return getattr(cause, "sqlstate", None) in CANCELLED_SQLSTATES


def lacks_schema(exc: BaseException) -> bool:
    """The statement named a table or column the database does not have."""
    if not isinstance(exc, DatabaseError):
        return False
    cause = exc.__cause__ or exc
    driver = storage_of_error(cause)
    return driver is not None and driver.lacks_schema(cause)


def unreachable(exc: BaseException, *, read_only: bool = False) -> Unreachable | None:
    """The database `exc` says did not answer or, for a page that writes nothing
    (`read_only`), cancelled its query or lacks leasing's schema; None for any other error.

    A page that writes is left its error when cancelled: what it wrote before
    the cancelled statement may be committed, so "nothing was changed" could be false.
    """
    cancelled = unmigrated = False
    if is_outage(exc):
        pass
    elif read_only and is_cancelled(exc):
        cancelled = True
    elif read_only and lacks_schema(exc):
        unmigrated = True
    else:
        return None
    # `run()` raises DatabaseUnavailable from Django's error: read that one.
    error = exc.__cause__ if isinstance(exc.__cause__, DatabaseError) else exc
    read = read_alias()
    alias = raised_by(error) or read
    read_database = alias == read and alias != WRITE_DATABASE
    return Unreachable(alias, one_line(error), read_database, cancelled, unmigrated)


def raised_by(error: BaseException) -> str | None:
    """The alias of the connection that raised `error`: the deepest Django
    connection (or cursor) among the frames it passed through."""
    alias = None
    frame = error.__traceback__
    while frame is not None:
        owner: Any = frame.tb_frame.f_locals.get("self")
        # type(), not isinstance(): isinstance asks a lazy object (request.user) its
        # __class__, which loads it, running the very query that just failed.
        kind = type(owner)
        if issubclass(kind, BaseDatabaseWrapper):
            alias = owner.alias
        elif issubclass(kind, CursorWrapper):
            alias = owner.db.alias
        frame = frame.tb_next
    return alias
