"""The monitoring SQL, verbatim: the tests run it, and docs/reference/monitoring-sql.md shows it."""

from __future__ import annotations

from django.db import connection

ACTIVE_AND_STALE = """
SELECT COUNT(*) AS active_leases,
       COUNT(*) FILTER (WHERE heartbeat_at < now() - interval '2 minutes') AS stale_leases
FROM work_items WHERE status = 'in_progress';
"""
RETRY_DISTRIBUTION = """
SELECT retry_count, COUNT(*) FROM work_items
WHERE status IN ('completed', 'failed') GROUP BY retry_count;
"""
TIMELINE = """
SELECT checkpoint_type, sequence_number, snapshot_data, created_at
FROM checkpoints WHERE task_id = 'task-001' ORDER BY sequence_number;
"""


def run(sql: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()
