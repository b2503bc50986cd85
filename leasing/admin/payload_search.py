"""Search in payloads: a JSON key = value filter on a work item's input or output.

`?input__customer=acme` keeps the items whose `input_data` has the top-level
key `customer` equal to `"acme"`; `?output__receipt.id=7` looks one level
down (`{"receipt": {"id": 7}}`). The list's "Payload key=value" field sends
`payload=customer=acme` with `payload_in=input|output`. A value that reads as
a JSON number, boolean or null also matches that (`amount=12` finds 12 and
"12").

On PostgreSQL the test is containment (`input_data @> '{"customer": "acme"}'`),
served by the GIN `jsonb_path_ops` indexes of migrations 0017 and 0018 (the
output's holds only items with an output); on SQLite a
JSON_EXTRACT per row (a scan: SQLite is for small sites and tests).

Only users with `leasing.view_payload` may search: for anyone else the filter
is ignored with a visible message, and the list, its counts and its pages are
those of the unfiltered list, so nothing about a payload can be inferred.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, cast

from django.db.models import Q, QuerySet
from django.db.models.fields.json import KeyTransform

from ..storage import storage_for
from .guards import storable

COLUMNS = {"input": "input_data", "output": "output_data"}
FORM_FIELD = "payload"
FORM_WHERE = "payload_in"
MAX_KEY_LENGTH = 200
MAX_VALUE_LENGTH = 1000
MAX_DEPTH = 5
MAX_FILTERS = 5


@dataclass(frozen=True, slots=True)
class PayloadFilter:
    """One `key = value` test on `column` (input_data or output_data)."""

    column: str
    path: tuple[str, ...]
    value: str

    def values(self) -> list[Any]:
        """The values that match: the text, and the JSON scalar it spells, if any."""
        typed = _typed(self.value)
        return [self.value] if typed is _NOT_TYPED else [self.value, typed]

    def contained(self, value: Any) -> dict[str, Any]:
        """`{"a": {"b": value}}` for the path a.b: what `@>` looks for."""
        nested: Any = value
        for key in reversed(self.path):
            nested = {key: nested}
        return dict(nested)

    def key_transform(self) -> KeyTransform:
        """The value at the path, as an expression (never a lookup spelled from user text:
        a key named `contains` or `in` must stay a key)."""
        expression: Any = self.column
        for key in self.path:
            expression = KeyTransform(key, expression)
        return cast(KeyTransform, expression)


_NOT_TYPED = object()


def _typed(raw: str) -> Any:
    """The JSON scalar `raw` spells (12, 1.5, true, null), or _NOT_TYPED.

    Python's parser also reads NaN, Infinity and 1e999 (infinite), which no
    stored JSON holds and the database refuses in a containment query: those
    are searched as text.
    """
    try:
        value = json.loads(raw, parse_constant=_not_json)
    except ValueError:
        return _NOT_TYPED
    if isinstance(value, float) and not math.isfinite(value):
        return _NOT_TYPED
    if value is None or isinstance(value, bool | int | float):
        return value
    return _NOT_TYPED


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def is_payload_param(name: str) -> bool:
    """A query-string key this module reads (never a column lookup)."""
    return name in (FORM_FIELD, FORM_WHERE) or name.startswith(
        tuple(f"{prefix}__" for prefix in COLUMNS)
    )


def parse(params: dict[str, str]) -> tuple[list[PayloadFilter], list[str]]:
    """The payload filters of a query string, and what was wrong with the others."""
    wanted: list[tuple[str, str, str, str]] = []  # (shown as, where, key, value)
    problems: list[str] = []
    for name, value in params.items():
        for where in COLUMNS:
            if name.startswith(f"{where}__"):
                wanted.append((f"{name}={value}", where, name.removeprefix(f"{where}__"), value))
    typed = params.get(FORM_FIELD, "").strip()
    if typed:
        where = params.get(FORM_WHERE) or "input"
        key, equals, value = typed.partition("=")
        if not equals:
            problems.append(f"{FORM_FIELD}={typed} (write key=value, e.g. customer=acme)")
        elif where not in COLUMNS:
            problems.append(f"{FORM_WHERE}={where} (input or output)")
        else:
            wanted.append((f"{where} {typed}", where, key.strip(), value.strip()))
    filters: list[PayloadFilter] = []
    for shown, where, key, value in wanted:
        path = tuple(key.split("."))
        if len(filters) == MAX_FILTERS:
            problems.append(f"{shown} (at most {MAX_FILTERS} payload filters)")
        elif not key or any(not part for part in path) or len(path) > MAX_DEPTH:
            problems.append(f"{shown} (a key, or keys.joined.by.dots, at most {MAX_DEPTH} deep)")
        elif len(key) > MAX_KEY_LENGTH or len(value) > MAX_VALUE_LENGTH:
            problems.append(f"{shown[:60]}… (too long)")
        elif not storable(key) or not storable(value):
            problems.append(f"{shown!r} (characters no payload can hold)")
        else:
            filters.append(PayloadFilter(COLUMNS[where], path, value))
    return filters, problems


def apply(queryset: QuerySet[Any], filters: list[PayloadFilter]) -> QuerySet[Any]:
    """Only the items every filter matches."""
    containment = storage_for(queryset.db).indexes_json_containment
    for n, payload_filter in enumerate(filters):
        condition = Q()
        if containment:
            for value in payload_filter.values():
                condition |= Q(
                    **{f"{payload_filter.column}__contains": payload_filter.contained(value)}
                )
        else:
            name = f"leasing_payload_{n}"
            queryset = queryset.alias(**{name: payload_filter.key_transform()})
            for value in payload_filter.values():
                condition |= Q(**{name: value})
        queryset = queryset.filter(condition)
    return queryset


def form_values(params: dict[str, str]) -> dict[str, str]:
    """What the list's payload form shows: the typed `key=value` and where."""
    return {"text": params.get(FORM_FIELD, ""), "where": params.get(FORM_WHERE) or "input"}
