"""Refuse what the database cannot store before it reaches a query.

A NUL character, or a lone surrogate that a test client or a proxy let
through, makes PostgreSQL raise `DataError` (and the driver
`UnicodeEncodeError`) even in a WHERE clause: an HTTP 500. Every value the
admin passes to a query from the URL, the query string or a form goes
through `storable()` first, and a refusal is an error message or a 404,
never a 500.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.http import QueryDict

from .. import validation
from ..exceptions import InvalidInput

# Longer identifiers or filter values than this are not ids anyone typed.
MAX_LENGTH = 10_000


def storable(value: str) -> bool:
    """True when `value` can be sent to PostgreSQL and SQLite as text, and is not huge."""
    if len(value) > MAX_LENGTH:
        return False
    try:
        validation.storable_text("value", value)
    except InvalidInput:
        return False
    return True


def first_unstorable(*parameters: QueryDict) -> str | None:
    """The name of the first parameter whose name or a value is not storable."""
    for params in parameters:
        for name, values in params.lists():
            if not storable(name) or not all(storable(v) for v in values):
                return repr(name[:50])
    return None


def unstorable_ids(ids: Iterable[str]) -> list[str]:
    return [pk for pk in ids if not storable(pk)]


BIGINT_MAX = 2**63 - 1


def not_integer_ids(ids: Iterable[str]) -> list[str]:
    """The ids of a selection on an integer primary key that are not one.

    The ORM raises on `pk__in=["abc"]` (ValueError) and the database on an id
    past bigint: without this check, a 500.
    """
    return [
        pk
        for pk in ids
        if not (pk.isascii() and pk.isdigit() and len(pk) <= 19 and 0 < int(pk) <= BIGINT_MAX)
    ]


REFUSAL = (
    "The request contains characters the database cannot store (a NUL byte or an "
    "unpaired surrogate) or a value over {limit:,} characters, in {name}; nothing "
    "was changed."
)


def refusal_message(name: str) -> str:
    return REFUSAL.format(limit=MAX_LENGTH, name=name)
