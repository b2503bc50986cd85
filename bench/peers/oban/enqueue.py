"""`python -m bench.peers.oban.enqueue DSN COUNT`: COUNT no-op jobs through oban-py's API.

The schema comes first if it is missing (`oban.schema.install`, what `oban
install` runs); then one `Oban.enqueue_many()` of a client-mode instance (no
queues: it only inserts). Prints one JSON line: {"peer", "count", "seconds"}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from oban import Oban
from oban.schema import install
from psycopg_pool import AsyncConnectionPool

from bench.peers.oban.jobs import Noop


async def _enqueue(dsn: str, count: int) -> float:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT to_regclass('oban_jobs') IS NOT NULL")
            row = await cur.fetchone()
            installed = bool(row and row[0])
        if not installed:
            await install(pool)
        oban = Oban(pool=pool)
        start = time.perf_counter()
        await oban.enqueue_many([Noop.new({}) for _ in range(count)])
        return time.perf_counter() - start


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit() or int(argv[1]) <= 0:
        print("usage: python -m bench.peers.oban.enqueue DSN COUNT", file=sys.stderr)
        return 2
    seconds = asyncio.run(_enqueue(argv[0], int(argv[1])))
    print(json.dumps({"peer": "oban", "count": int(argv[1]), "seconds": round(seconds, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
