"""The no-op oban-py worker the peers' scenario drains."""

from __future__ import annotations

from typing import Any

from oban import worker


@worker(queue="default")
class Noop:
    async def process(self, job: Any) -> None:
        return None
