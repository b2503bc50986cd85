"""What the leasing tables each database alias read and wrote during a block of a test."""

from __future__ import annotations

import re

from django.db import connections
from django.test.utils import CaptureQueriesContext

LEASING_TABLES = {"work_items", "checkpoints", "idempotency_keys", "workers"}
TABLE = re.compile(r'\b(?:FROM|JOIN|UPDATE|INTO)\s+"?([a-z_]+)"?', re.IGNORECASE)
WRITE = re.compile(r'^\s*(?:UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+"?([a-z_]+)"?', re.IGNORECASE)


class Seen:
    """The leasing tables each alias read and wrote during one block."""

    def __init__(self) -> None:
        self.captures = {alias: CaptureQueriesContext(connections[alias]) for alias in connections}

    def __enter__(self) -> Seen:
        for capture in self.captures.values():
            capture.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for capture in self.captures.values():
            capture.__exit__(*exc)

    def _sql(self, alias: str) -> list[str]:
        return [q["sql"] for q in self.captures[alias].captured_queries]

    def read(self, alias: str) -> set[str]:
        return {t for sql in self._sql(alias) for t in TABLE.findall(sql)} & LEASING_TABLES

    def written(self, alias: str) -> set[str]:
        return {t for sql in self._sql(alias) for t in WRITE.findall(sql)} & LEASING_TABLES


def listening_sessions() -> int:
    """Sessions of the test database that are a worker's listener (`wakes.LISTENING`)."""
    from django.db import connection

    from leasing.sql.wakes import LISTENING

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            f"AND {LISTENING}"
        )
        return cursor.fetchone()[0]
