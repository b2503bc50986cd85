"""Statements of the marks (`leasing_rollup_marks`): how far a periodic pass has gone.

A mark is a name and a time. The console's hourly rollup keeps one
(`leasing.services.rollups`); the sweep's checkpoint cleanup keeps two per
retention limit (`leasing.services.checkpoints.cleanup_checkpoints_since_mark`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from .runner import Statement

if TYPE_CHECKING:
    from ..storage.base import Storage


TABLE = "leasing_rollup_marks"


def ensure_mark(name: str) -> Statement:
    return (
        f"INSERT INTO {TABLE} (name, through) VALUES (%s, NULL) ON CONFLICT (name) DO NOTHING",
        [name],
    )


def read_mark(name: str) -> Statement:
    return f"SELECT through FROM {TABLE} WHERE name = %s", [name]


def lock_mark(d: Storage, name: str) -> Statement:
    """The mark, locked until the transaction ends (one pass at a time)."""
    sql, params = read_mark(name)
    return f"{sql} {d.row_lock('UPDATE')}", params


def set_mark(d: Storage, name: str, through: datetime) -> Statement:
    return (
        f"UPDATE {TABLE} SET through = %s WHERE name = %s",
        [d.datetime_param(through), name],
    )


def read_marks(names: list[str]) -> Statement:
    """The named marks that exist, as rows of (name, through)."""
    placeholders = ", ".join(["%s"] * len(names))
    return f"SELECT name, through FROM {TABLE} WHERE name IN ({placeholders})", list(names)


def advance_mark(d: Storage, name: str, through: datetime) -> Statement:
    """Create the mark at `through`, or move it there unless it is there or beyond already.

    Passes that run at once each advance it to their own time; a mark never
    goes back.
    """
    return (
        f"""INSERT INTO {TABLE} AS m (name, through) VALUES (%s, %s)
            ON CONFLICT (name) DO UPDATE SET through = excluded.through
            WHERE m.through IS NULL OR m.through < excluded.through""",
        [name, d.datetime_param(through)],
    )
