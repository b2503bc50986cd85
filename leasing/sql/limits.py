"""Global concurrency limits in the claim: at most N items of a queue or work type in flight.

`LEASING["QUEUE_LIMITS"]` and `LEASING["WORK_TYPE_LIMITS"]` cap the
`in_progress` rows of a queue or work type across every worker and host. A
claim that may take from a limited queue or type (its filters allow it) is
built differently from the plain claim; every other claim is unchanged.

* `room`: per limited key, the limit minus its in-flight rows (counted
  through the partial index `work_items_in_flight_idx`), never below 0.
* One branch of candidates per cell of (each limited queue, or any unlimited
  queue) x (each limited work type, or any unlimited type), each at most the
  smallest of `n` and its keys' rooms; a cell whose room is 0 reads nothing.
  A queue at its limit so costs the claim no slots: the batch fills with
  other work. Each branch walks the claim index in claim order, as a claim
  filtered to one queue does (that walk is the price of a limit).
* A limited key's items come from several cells: the union is trimmed to
  each limited type's room, then each limited queue's, by rank in claim
  order, then to `n`. The trims can leave a slot unused in a rare mix of
  limits (a row kept by its type's trim, then dropped by its queue's); never
  one too many.
* Past `MAX_CELLS` cells (the statement grows with their product: 100 queue
  and 100 type limits took PostgreSQL's planner past its memory, and SQLite
  refuses more than 500 terms in a UNION or 65,535 mentions of a table), one
  walk of the claim index in claim order instead, of at most `n` rows none of
  whose keys has no room, then the same trims: a key with some room whose
  items lead the walk can take slots that its trim then leaves unused; never
  one too many. The rooms' counts are one union of a term per limited key,
  nested in groups (`union_all`) below SQLite's bound.
* In the batch statement that also completes items (CTE `done`), the counts
  take off the items it completes: its snapshot still sees them in flight.

On PostgreSQL a count is only as good as the statement's snapshot, so two
concurrent claimers could each see room for the same slot. Claims of a
limited key serialize on a transaction-level advisory lock
(`Storage.run_claim`), taken in a statement of its own before the claim, in the
same transaction: the claim's snapshot is taken after the lock is granted,
so it sees every claim committed by the previous holder (READ COMMITTED,
Django's default). Advisory xact locks work through pgbouncer in
transaction mode. Past `LOCK_SLOTS` limits in the settings the keys share
that many locks (`Limits.lock_keys`), so a claim holds a bounded number of
the server's shared lock slots. SQLite has one writer, so the count in the claim statement
is exact.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..states import PauseKind, WorkItemStatus
from .runner import Statement

if TYPE_CHECKING:
    from ..storage.base import Storage

QUEUE = PauseKind.QUEUE.value
WORK_TYPE = PauseKind.WORK_TYPE.value
IN_PROGRESS = f"'{WorkItemStatus.IN_PROGRESS.value}'"
# Claim order: priority, then the time the item became available (its
# `run_after`, or its enqueue time), then enqueue order. The partial index
# `work_items_claim_idx` has exactly these keys.
AVAILABLE_AT = "COALESCE(run_after, created_at)"
CLAIM_ORDER = f"priority DESC, {AVAILABLE_AT}, created_at, work_item_id"
# The most SELECTs one UNION ALL joins. SQLite refuses a compound SELECT of more than
# 500 terms (SQLITE_MAX_COMPOUND_SELECT), and a claim has one branch per cell of
# (limited queues + 1) x (limited types + 1): 30 queue and 20 type limits, which the
# check accepts, are 651. Longer unions are nested in groups of at most this many.
UNION_GROUP = 250
# Past this many cells a claim walks the claim index once instead (see the module): 10,000
# cells (100 queue and 100 type limits) took PostgreSQL's planner past its memory, and
# SQLite refuses a statement naming a table more than 65,535 times.
MAX_CELLS = 64
# Past this many limits in the settings, their advisory locks are shared (`Limits.lock_keys`).
LOCK_SLOTS = 32


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits a claim may run into: (name, limit) pairs, sorted by name.

    `lock_slots`: 0, each limited key has an advisory lock of its own; else the keys
    share that many locks, by a stable hash of the key (`lock_keys`).
    """

    queues: tuple[tuple[str, int], ...] = ()
    work_types: tuple[tuple[str, int], ...] = ()
    lock_slots: int = 0

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

        # Decided by the settings, not the claim's filters, so that every claim of a key
        # takes the same lock whatever else it may take.
        many = len(queue_limits) + len(work_type_limits) > LOCK_SLOTS
        return cls(
            relevant(queue_limits, queues),
            relevant(work_type_limits, work_types),
            LOCK_SLOTS if many else 0,
        )

    def lock_keys(self) -> list[str]:
        """The names of the advisory locks a claim of these limits takes (PostgreSQL).

        One per limited key; past `LOCK_SLOTS` limits in the settings, the keys share
        `LOCK_SLOTS` locks (CRC-32 of the key): each advisory lock takes a slot of the
        server's shared lock table (`max_locks_per_transaction` x connections, 6,400
        by default) until commit, and a claim of hundreds of limits by each of a few
        workers at once would fill it, failing every transaction on the server. Two
        keys that share a lock only wait for each other."""
        keys = [f"{QUEUE}:{q}" for q, _ in self.queues] + [
            f"{WORK_TYPE}:{t}" for t, _ in self.work_types
        ]
        if not self.lock_slots:
            return keys
        return sorted(
            {f"slot:{zlib.crc32(key.encode()) % self.lock_slots}" for key in keys},
            key=lambda name: int(name.removeprefix("slot:")),
        )


def union_all(selects: list[str]) -> str:
    """`selects` joined by UNION ALL, nested so that no compound SELECT has more than
    `UNION_GROUP` terms (the rows and their order are those of the flat union)."""
    while len(selects) > UNION_GROUP:
        selects = [
            f"SELECT * FROM ({' UNION ALL '.join(selects[i : i + UNION_GROUP])}) AS u{i}"
            for i in range(0, len(selects), UNION_GROUP)
        ]
    return " UNION ALL ".join(selects)


def room_cte(limits: Limits, *, after_done: bool) -> Statement:
    """Each limited key's room. `after_done`: the statement also completes held items
    (CTE `done`); those still count as in flight in its snapshot, so they are taken off."""
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
                f"AND {column} = %s)"
                + (f" - (SELECT count(*) FROM done WHERE {column} = %s)" if after_done else "")
                + " AS used"
            )
            params += [name, limit, name, *([name] if after_done else [])]
    sql = f"""room AS (
        SELECT kind, name, CASE WHEN used < cap THEN cap - used ELSE 0 END AS room
        FROM ({union_all(rows)}) AS counted
    )"""
    return sql, params


def trim_to_room(rows: str, kind: str, column: str, order: str) -> str:
    """Keep each limited key's first `room` rows of `rows`, in claim order."""
    return f"""
        SELECT * FROM (
            SELECT k.*, row_number() OVER (PARTITION BY {column} ORDER BY {order}) AS nth_{kind}
            FROM ({rows}) AS k
        ) AS r{kind}
        WHERE NOT EXISTS (SELECT 1 FROM room WHERE kind = '{kind}'
                          AND name = r{kind}.{column} AND r{kind}.nth_{kind} > room)
    """


def limited_candidates(
    d: Storage,
    where: str,
    where_params: list[Any],
    n: int,
    limits: Limits,
    *,
    after_done: bool = False,
) -> Statement:
    """CTEs ending in `candidate(work_item_id)` (and `ctid` on PostgreSQL, where the
    rows are locked): what a limited claim takes (see the module)."""
    lock = f" {d.skip_locked()}"
    columns = (
        f"{d.with_address('work_item_id')}, queue_name, work_type, priority, "
        f"{AVAILABLE_AT} AS available_at, created_at"
    )
    order = CLAIM_ORDER.replace(AVAILABLE_AT, "available_at")
    room_sql, params = room_cte(limits, after_done=after_done)
    ctes = [room_sql]
    limited_queues = [q for q, _ in limits.queues]
    limited_types = [t for t, _ in limits.work_types]

    def cell(column: str, name: str | None, limited: list[str]) -> Statement:
        """One key of a column, or (None) every value that is not limited."""
        if name is not None:
            return f"AND {column} = %s", [name]
        if not limited:
            return "", []
        clause, clause_params = d.in_list(column, limited)
        return f"AND NOT ({clause})", clause_params

    def room_of(kind: str, name: str | None) -> Statement:
        if name is None:
            return "%s", [n]
        return (
            f"COALESCE((SELECT room FROM room WHERE kind = '{kind}' AND name = %s), 0)",
            [name],
        )

    cells = [
        (queue, work_type)
        for queue in [*limited_queues, None]
        for work_type in [*limited_types, None]
    ]
    if len(cells) > MAX_CELLS:
        # Too many cells for one statement: one walk in claim order past the full keys.
        ctes.append(
            f"c1 AS (SELECT {columns} FROM work_items WHERE {where} AND NOT EXISTS ("
            f"SELECT 1 FROM room WHERE room.room = 0 AND ("
            f"(room.kind = '{QUEUE}' AND room.name = work_items.queue_name) OR "
            f"(room.kind = '{WORK_TYPE}' AND room.name = work_items.work_type))) "
            f"ORDER BY {CLAIM_ORDER} LIMIT %s{lock})"
        )
        params.extend([*where_params, n])
        cells = []
    # One branch per (queue, work type) cell: a limited key or "any unlimited one".
    for queue, work_type in cells:
        q_sql, q_params = cell("queue_name", queue, limited_queues)
        t_sql, t_params = cell("work_type", work_type, limited_types)
        q_room, q_room_params = room_of(QUEUE, queue)
        t_room, t_room_params = room_of(WORK_TYPE, work_type)
        # The fewest of n and the rooms, each in its own bounded subquery.
        limit = (
            f"(SELECT min(x) FROM (SELECT %s AS x UNION ALL SELECT {q_room} "
            f"UNION ALL SELECT {t_room}) AS rooms)"
        )
        ctes.append(
            f"c{len(ctes)} AS (SELECT {columns} FROM work_items "
            f"WHERE {where} {q_sql} {t_sql} ORDER BY {CLAIM_ORDER} LIMIT {limit}{lock})"
        )
        params.extend([*where_params, *q_params, *t_params, n, *q_room_params, *t_room_params])
    rows = union_all([f"SELECT * FROM c{i}" for i in range(1, len(ctes))])
    # A limited type's rows come from several cells, and so do a limited
    # queue's: keep each key's first `room` in claim order (type, then queue).
    if limited_types:
        rows = trim_to_room(rows, WORK_TYPE, "work_type", order)
    if limited_queues:
        rows = trim_to_room(rows, QUEUE, "queue_name", order)
    ctes.append(
        f"candidate AS (SELECT {d.with_address('work_item_id')} "
        f"FROM ({rows}) AS t ORDER BY {order} LIMIT %s)"
    )
    params.append(n)
    return ", ".join(ctes), params
