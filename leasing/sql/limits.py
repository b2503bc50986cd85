"""Global concurrency limits in the claim: at most N items of a queue or work type in flight.

`LEASING["QUEUE_LIMITS"]` and `LEASING["WORK_TYPE_LIMITS"]` cap the
`in_progress` rows of a queue or work type across every worker and host. A
claim that may take from a limited queue or type (its filters allow it) is
built differently from the plain claim; every other claim is unchanged.

* `room`: per limited key, the limit minus its in-flight rows (counted
  through the partial index `work_items_in_flight_idx`), never below 0.
* One branch of candidates per limited queue and per limited work type,
  each at most its room, plus one branch for everything unlimited (at most
  `n`): a queue at its limit costs no claim slots, so a worker keeps its
  batch full of other work. Each branch walks the claim index in claim
  order, as a claim filtered to one queue does.
* An item of a limited queue that also has a limited work type is taken by
  its queue's branch; the union is trimmed to each limited type's room by
  rank within the type, then to `n` in claim order.

On PostgreSQL a count is only as good as the statement's snapshot, so two
concurrent claimers could each see room for the same slot. Claims of a
limited key serialize on a transaction-level advisory lock
(`lock_statement`), taken in a statement of its own before the claim, in the
same transaction: the claim's snapshot is taken after the lock is granted,
so it sees every claim committed by the previous holder (READ COMMITTED,
Django's default). Advisory xact locks work through pgbouncer in
transaction mode. SQLite has one writer, so the count in the claim statement
is exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..states import PauseKind, WorkItemStatus
from .dialect import Dialect
from .runner import Statement

QUEUE = PauseKind.QUEUE.value
WORK_TYPE = PauseKind.WORK_TYPE.value
IN_PROGRESS = f"'{WorkItemStatus.IN_PROGRESS.value}'"
# Claim order: priority, then the time the item became available (its
# `run_after`, or its enqueue time), then enqueue order. The partial index
# `work_items_claim_idx` has exactly these keys.
AVAILABLE_AT = "COALESCE(run_after, created_at)"
CLAIM_ORDER = f"priority DESC, {AVAILABLE_AT}, created_at, work_item_id"


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits a claim may run into: (name, limit) pairs, sorted by name."""

    queues: tuple[tuple[str, int], ...] = ()
    work_types: tuple[tuple[str, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.queues or self.work_types)

    @classmethod
    def for_claim(
        cls,
        queue_limits: Mapping[str, int],
        work_type_limits: Mapping[str, int],
        queues: tuple[str, ...] | None,
        work_types: tuple[str, ...] | None,
    ) -> Limits:
        """The limits a claim with these filters (None: any) may touch."""

        def relevant(limits: Mapping[str, int], allowed: tuple[str, ...] | None) -> Any:
            return tuple(
                sorted((k, v) for k, v in limits.items() if allowed is None or k in allowed)
            )

        return cls(relevant(queue_limits, queues), relevant(work_type_limits, work_types))

    def lock_keys(self) -> list[str]:
        return [f"{QUEUE}:{q}" for q, _ in self.queues] + [
            f"{WORK_TYPE}:{t}" for t, _ in self.work_types
        ]


def lock_statement(limits: Limits) -> Statement:
    """PostgreSQL: the advisory lock of each limited key, in code-point order (no cycles)."""
    sql = """
        SELECT count(pg_advisory_xact_lock(hashtextextended('leasing.limit:' || k, 0)))
            AS locked
        FROM (SELECT k FROM unnest(%s::text[]) AS u(k) ORDER BY k COLLATE "C") AS o
    """
    return sql, [sorted(set(limits.lock_keys()))]


def _room_cte(limits: Limits) -> Statement:
    rows: list[str] = []
    params: list[Any] = []
    for kind, column, pairs in (
        (QUEUE, "queue_name", limits.queues),
        (WORK_TYPE, "work_type", limits.work_types),
    ):
        for name, limit in pairs:
            rows.append(
                f"SELECT '{kind}' AS kind, CAST(%s AS TEXT) AS name, %s AS cap, "
                f"(SELECT count(*) FROM work_items WHERE status = {IN_PROGRESS} "
                f"AND {column} = %s) AS used"
            )
            params += [name, limit, name]
    sql = f"""room AS (
        SELECT kind, name, CASE WHEN used < cap THEN cap - used ELSE 0 END AS room
        FROM ({" UNION ALL ".join(rows)}) AS counted
    )"""
    return sql, params


def _room_of(kind: str) -> str:
    """At most `n` (the first parameter), at most the room of the key (the second)."""
    return (
        "COALESCE((SELECT CASE WHEN room < %s THEN room ELSE %s END FROM room "
        f"WHERE kind = '{kind}' AND name = %s), 0)"
    )


def limited_candidates(
    d: Dialect, where: str, where_params: list[Any], n: int, limits: Limits
) -> Statement:
    """CTEs ending in `candidate(work_item_id)`: what a limited claim takes (see the module)."""
    lock = f" {d.lock_skip_locked()}" if d.is_postgres else ""
    columns = (
        f"work_item_id, queue_name, work_type, priority, {AVAILABLE_AT} AS available_at, created_at"
    )
    order = CLAIM_ORDER.replace(AVAILABLE_AT, "available_at")
    room_sql, params = _room_cte(limits)
    ctes = [room_sql]
    limited_queues = [q for q, _ in limits.queues]
    limited_types = [t for t, _ in limits.work_types]

    def branch(extra: str, extra_params: list[Any], limit: str, limit_params: list[Any]) -> None:
        ctes.append(
            f"c{len(ctes)} AS (SELECT {columns} FROM work_items WHERE {where} {extra} "
            f"ORDER BY {CLAIM_ORDER} LIMIT {limit}{lock})"
        )
        params.extend([*where_params, *extra_params, *limit_params])

    not_limited = ""
    not_limited_params: list[Any] = []
    for column, names in (("queue_name", limited_queues), ("work_type", limited_types)):
        if names:
            clause, clause_params = d.in_list(column, names)
            not_limited += f" AND NOT ({clause})"
            not_limited_params += clause_params
    branch(not_limited, not_limited_params, "%s", [n])
    capped_types = f"(SELECT name FROM room WHERE kind = '{WORK_TYPE}' AND room = 0)"
    for queue in limited_queues:
        branch(
            f"AND queue_name = %s AND work_type NOT IN {capped_types}",
            [queue],
            _room_of(QUEUE),
            [n, n, queue],
        )
    queues_clause, queues_params = ("", [])
    if limited_queues:
        clause, clause_params = d.in_list("queue_name", limited_queues)
        queues_clause, queues_params = f"AND NOT ({clause})", clause_params
    for work_type in limited_types:
        branch(
            f"AND work_type = %s {queues_clause}",
            [work_type, *queues_params],
            _room_of(WORK_TYPE),
            [n, n, work_type],
        )
    union = " UNION ALL ".join(f"SELECT * FROM c{i}" for i in range(1, len(ctes)))
    if limited_types:
        # Items of a limited type can come from several branches: keep each
        # type's first `room` of them in claim order.
        ranked = f"""
            SELECT u.*, row_number() OVER (PARTITION BY work_type ORDER BY {order}) AS nth
            FROM ({union}) AS u
        """
        union = f"""
            SELECT * FROM ({ranked}) AS r
            WHERE NOT EXISTS (SELECT 1 FROM room WHERE kind = '{WORK_TYPE}'
                              AND name = r.work_type AND r.nth > room)
        """
    ctes.append(f"candidate AS (SELECT work_item_id FROM ({union}) AS t ORDER BY {order} LIMIT %s)")
    params.append(n)
    return ", ".join(ctes), params
