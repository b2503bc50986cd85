"""Which database a console page could not read, and why, in one line.

A console page reads `leasing.conf.read_alias()` (`LEASING["READ_DATABASE"]`,
often a streaming replica) and, for a few figures, the primary. When one of
them does not answer (connection refused, a file that cannot be opened, a
dropped connection), `unreachable(exc)` names the alias whose connection
raised and the driver's one-line reason; any other error (a bad statement, a
lock conflict) is not an outage and stays the error it is. The admin answers
with a 503 page (`leasing.admin.views.unreachable`) and `/metrics` with a 503
line: never a traceback, and never figures read from another database instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import DatabaseError, InterfaceError, OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from ..conf import WRITE_DATABASE, read_alias
from ..exceptions import DatabaseUnavailable, one_line
from ..sql.runner import is_connection_error, lost_protocol


@dataclass(frozen=True, slots=True)
class Unreachable:
    """A database that did not answer a page's read."""

    alias: str
    reason: str  # the driver's error, one line
    read_database: bool  # the alias is LEASING["READ_DATABASE"], not the primary

    @property
    def text(self) -> str:
        """One line for `/metrics` and logs: which database, why, what to do."""
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


def unreachable(exc: BaseException) -> Unreachable | None:
    """The database `exc` says did not answer, or None when `exc` is no outage."""
    if not is_outage(exc):
        return None
    # `run()` raises DatabaseUnavailable from Django's error: read that one.
    error = exc.__cause__ if isinstance(exc.__cause__, DatabaseError) else exc
    read = read_alias()
    alias = raised_by(error) or read
    return Unreachable(alias, one_line(error), alias == read and alias != WRITE_DATABASE)


def raised_by(error: BaseException) -> str | None:
    """The alias of the connection that raised `error`: the deepest Django
    connection (or cursor) among the frames it passed through."""
    alias = None
    frame = error.__traceback__
    while frame is not None:
        owner = frame.tb_frame.f_locals.get("self")
        if isinstance(owner, BaseDatabaseWrapper):
            alias = owner.alias
        elif isinstance(owner, CursorWrapper):
            alias = owner.db.alias
        frame = frame.tb_next
    return alias
