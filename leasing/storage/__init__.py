"""The storage boundary: everything that differs between PostgreSQL and SQLite.

One class per database behind one interface, `Storage` (`base`), as Oban keeps
one engine per database:

* `PostgresStorage` (`leasing.storage.postgres`): SKIP LOCKED claims, advisory
  locks, NOTIFY, COPY, statements that address rows by `ctid`;
* `SQLiteStorage` (`leasing.storage.sqlite`): one writer at a time (IMMEDIATE
  transactions), so compare-and-swap statements need no row locks.

The statement catalogue (`leasing.sql`) writes its statements once, from a
storage's fragments (the database clock, list parameters, row locks); what
only one database can say, and the sequences of statements that differ (a
claim, the sweep's recovery, a batch insert, renewals), are the storage's
methods. Nothing outside this package asks which database it runs on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import connections

from ..exceptions import LeasingConfigurationError

if TYPE_CHECKING:
    from .base import Storage

_CLASSES: dict[str, type[Storage]] = {}


def _classes() -> dict[str, type[Storage]]:
    if not _CLASSES:
        # Imported on first use: the vendor modules import the catalogue, which
        # imports this package's types.
        from .postgres import PostgresStorage
        from .sqlite import SQLiteStorage

        _CLASSES.update({"postgresql": PostgresStorage, "sqlite": SQLiteStorage})
    return _CLASSES


def storage_for(using: str = "default") -> Storage:
    """The storage of a database alias (a new, cheap object: it holds only the alias)."""
    vendor = connections[using].vendor
    cls = _classes().get(vendor)
    if cls is None:
        # Other backends lack SKIP LOCKED or RETURNING the way the statements
        # use them; failing loudly beats double-claiming.
        raise LeasingConfigurationError(
            f"The leasing app supports PostgreSQL and SQLite, not {vendor!r}."
        )
    return cls(using)


def listens(using: str) -> bool:
    """Whether workers can LISTEN through this alias (its database is PostgreSQL)."""
    cls = _classes().get(connections[using].vendor)
    return cls is not None and cls.can_listen


def storage_of_error(error: BaseException) -> type[Storage] | None:
    """The storage whose driver raised `error` (None: a driver leasing does not know)."""
    for cls in _classes().values():
        if cls.raised(error):
            return cls
    return None


__all__ = ["listens", "storage_for", "storage_of_error"]
