"""Running a handler inside a test's transaction without letting it break the transaction.

On PostgreSQL a failed statement aborts the whole transaction, and Django
refuses queries after an error it marked for rollback; a worker's handler
runs in autocommit and meets neither. Inside a test's transaction
(pytest-django's `db`, Django's `TestCase`) the handler runs in a savepoint,
rolled back only if the transaction is broken (its writes are then undone,
where in production its statements before the error would have committed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

# Django 6.1 renamed savepoint() (6.0 has only the old name).
_savepoint_create = getattr(transaction, "savepoint_create", None) or transaction.savepoint


class BrokenTransaction(RuntimeError):
    """The handler left the test's transaction unusable without raising."""


@contextlib.contextmanager
def contained(using: str) -> Iterator[None]:
    """Run the block in a savepoint if a transaction is open; undo it only if it broke that.

    A block that raises leaves its exception as it was; one that returns but
    left the transaction broken raises `BrokenTransaction`.
    """
    connection = connections[using]
    if not connection.in_atomic_block:
        yield
        return
    savepoint = _savepoint_create(using=using)
    try:
        yield
    except BaseException:
        _release(connection, savepoint, using)
        raise
    if _release(connection, savepoint, using):
        raise BrokenTransaction(
            "The handler caught a database error that left the test's transaction "
            "unusable; its writes were rolled back. Contain the failing statement in "
            "transaction.atomic(), or run the test with transactional_db."
        )


def _release(connection: BaseDatabaseWrapper, savepoint: str, using: str) -> bool:
    """Release the savepoint, or roll back to it if the transaction is broken (True)."""
    if _broken(connection):
        connection.needs_rollback = False
        transaction.savepoint_rollback(savepoint, using=using)
        return True
    transaction.savepoint_commit(savepoint, using=using)
    return False


def _broken(connection: BaseDatabaseWrapper) -> bool:
    if connection.needs_rollback:
        return True
    info = getattr(connection.connection, "info", None)  # psycopg 3
    status = getattr(info, "transaction_status", None)
    return getattr(status, "name", "") == "INERROR"
