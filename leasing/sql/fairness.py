"""Fair claims: in a queue of `LEASING["FAIR_QUEUES"]`, claims take turns across fairness keys.

Items may carry a `fairness_key` (a tenant). A plain claim takes items in claim
order, so a tenant that enqueued 200,000 items first holds every other
tenant back until its backlog drains. A claim that may take from a fair
queue instead reads, per fair queue:

* the next keys in rotation: a skip scan of `work_items_fair_idx` (keyed by
  queue, then key, then claim order) from the key this manager served last
  (its cursor), one index probe per key (the first key after the previous
  one), at most `n` keys, wrapping around to the first key;
* each of those keys' first items in claim order (a LATERAL read on
  PostgreSQL, a correlated IN on SQLite), each an index range scan that
  stops after its share, `2 x ceil(n / keys) x weight` rows, locked with
  SKIP LOCKED (twice the even split, so that a key with a backlog still fills
  the batch beside keys with an item or two, while a claim locks at most
  about 2n rows; a lone key reads `n x weight`, since no turn reaches past
  the claim's `n`);
* the queue's items without a key, as one more turn.

So the claim reads about `n` index probes and `n` rows whatever the number
of keys or items waiting: no walk past one tenant's backlog. The rows are
ordered by turn (an item's rank within its key divided by the key's weight,
`LEASING["FAIRNESS_WEIGHTS"]`), then by the key's place in the rotation,
then claim order; the first `n` are claimed, and the cursor moves to the
last key served. A key with items therefore gets at least one of each
claim's first `keys` slots whenever the rotation reaches it: with `k` keys
waiting and batches of `n`, each key is served within `ceil(k / n)` claims.
Priority orders items within a key, not across keys.

The other queues a claim may take from are read by one walk of the claim
index as a last turn (a worker that serves fair queues and others walks past
the fair queues' items for the others: give fair queues their own workers).
Concurrency limits trim the rows as in a limited claim (`leasing.sql.limits`);
pauses are the claim's condition, as everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..states import PauseKind
from .limits import CLAIM_ORDER, Limits, room_cte, trim_to_room
from .runner import Statement
from .terms import ClaimFilters
from .work_items import PENDING

if TYPE_CHECKING:
    from ..storage.base import Storage

# The fair index's condition, written as the index declares it (so PostgreSQL uses it).
BASE = f"status = {PENDING} AND dependencies_left = 0"
ITEM_COLUMNS = (
    "work_item_id, queue_name, work_type, fairness_key, priority, "
    "COALESCE(run_after, created_at) AS available_at, created_at"
)
ITEM_NAMES = (
    "work_item_id", "queue_name", "work_type", "fairness_key", "priority", "available_at",
    "created_at",
)  # fmt: skip
TURN_ORDER = "turn, pos, priority DESC, available_at, created_at, work_item_id"
# Claim order within a key, over the columns of `ITEM_COLUMNS`.
C_ORDER = "c.priority DESC, c.available_at, c.created_at, c.work_item_id"
# A key's share of a claim of n, as a multiple of the even split ceil(n / keys).
SHARE_FACTOR = 2
# The turn of every item beyond the fair queues' keys: after them all.
LAST_TURN = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Fairness:
    """What a claim's rotation needs: the fair queues it may take from, with each one's
    cursor (the key served last, "" for none), the weights, and the other queues."""

    queues: tuple[tuple[str, str], ...]
    weights: tuple[tuple[str, int], ...] = ()
    # The claim may also take from queues that are not fair (all of `fair` excluded).
    others: bool = False
    fair: tuple[str, ...] = ()

    @classmethod
    def for_claim(
        cls,
        filters: ClaimFilters,
        fair_queues: Sequence[str],
        weights: Mapping[str, int],
        cursors: Mapping[str, str],
    ) -> Fairness | None:
        """The rotation of a claim with these filters; None when it takes from no fair queue."""
        allowed = filters.queues
        queues = [q for q in fair_queues if allowed is None or q in allowed]
        if not queues:
            return None
        others = allowed is None or any(q not in fair_queues for q in allowed)
        return cls(
            tuple((q, cursors.get(q, "")) for q in queues),
            tuple(sorted(weights.items())),
            others,
            tuple(fair_queues),
        )


def _keys(j: int, queue: str, cursor: str, n: int) -> tuple[list[str], list[Any]]:
    """CTEs `ks{j}(k, pos)`: the next (at most) `n` keys of a queue in rotation from `cursor`."""

    def scan(name: str, start: str, start_params: list[Any], stop: str) -> tuple[str, list[Any]]:
        # The next key: the first entry of the fair index past `after`. It reads a column
        # the index lacks (lease_token), so the probe is a plain index scan, not an
        # index-only one: the entries of items claimed since the last vacuum are dead,
        # and only a scan that visits their rows marks them so (later probes skip them;
        # an index-only probe walked them all again, every claim).
        def probe(after: str) -> str:
            return (
                f"SELECT fairness_key FROM work_items WHERE {BASE} AND queue_name = %s "
                f"{after} AND lease_token >= 0 ORDER BY fairness_key LIMIT 1"
            )

        sql = f"""{name}(k, i) AS (
            SELECT ({probe(start)}), 1
            UNION ALL
            SELECT ({probe(f"AND fairness_key > {name}.k")}), {name}.i + 1
            FROM {name} WHERE {name}.k IS NOT NULL AND {name}.i < %s {stop}
        )"""
        return sql, [queue, *start_params, queue, n]

    after, after_params = scan(f"ka{j}", "AND fairness_key > %s", [cursor], "")
    ctes, params = [after], after_params
    union = f"SELECT k, i AS pos FROM ka{j} WHERE k IS NOT NULL"
    union_params: list[Any] = []
    if cursor:
        # Around again from the first key, up to the cursor itself.
        before, before_params = scan(f"kb{j}", "", [], f"AND kb{j}.k < %s")
        ctes.append(before)
        params += [*before_params, cursor]
        union += f" UNION ALL SELECT k, %s + i FROM kb{j} WHERE k IS NOT NULL AND k <= %s"
        union_params += [n, cursor]
    ctes.append(f"ks{j}(k, pos) AS (SELECT k, pos FROM ({union}) AS r ORDER BY pos LIMIT %s)")
    params += [*union_params, n]
    return ctes, params


def _weight(column: str, weights: tuple[tuple[str, int], ...]) -> tuple[str, list[Any]]:
    if not weights:
        return "1", []
    whens = " ".join("WHEN %s THEN %s" for _ in weights)
    return f"(CASE {column} {whens} ELSE 1 END)", [v for pair in weights for v in pair]


def fair_candidates(
    d: Storage,
    condition: str,
    condition_params: list[Any],
    n: int,
    fairness: Fairness,
    limits: Limits,
    *,
    after_done: bool = False,
) -> Statement:
    """CTEs (to follow `WITH RECURSIVE`) ending in `candidate`: up to `n` rows in turn order,
    with `work_item_id` (and the row's address, `Storage.with_address`), `queue_name`,
    `fairness_key`, `pos` and `turn`."""
    lock = d.skip_locked()
    address = d.with_address("work_item_id")
    columns = address + ITEM_COLUMNS.removeprefix("work_item_id")
    # The per-key rows' columns, as `first_rows_of_each` names them.
    picked = ", ".join(f"c.{name}" for name in (*address.split(", "), *ITEM_NAMES[1:]))
    order = CLAIM_ORDER.replace("COALESCE(run_after, created_at)", "available_at")
    ctes: list[str] = []
    params: list[Any] = []
    branches: list[str] = []
    if limits:
        room_sql, room_params = room_cte(limits, after_done=after_done)
        ctes.append(room_sql)
        params += room_params
    for j, (queue, cursor) in enumerate(fairness.queues):
        key_ctes, key_params = _keys(j, queue, cursor, n)
        ctes += key_ctes
        params += key_params
        weight, weight_params = _weight(f"ks{j}.k", fairness.weights)
        # A lone key's share is the whole claim: twice it would lock rows no turn reaches.
        share = (
            f"(SELECT CASE count(*) WHEN 1 THEN %s "
            f"ELSE {SHARE_FACTOR} * ((%s + count(*) - 1) / count(*)) END FROM ks{j})"
        )
        # A key's share of the claim, by its weight; where a LIMIT cannot read the key's
        # row, every key reads its share times the largest weight, and the turns pick.
        most = max((w for _, w in fairness.weights), default=1)
        source, source_params = d.first_rows_of_each(
            f"ks{j}",
            columns,
            (
                f"{condition} AND queue_name = %s AND fairness_key = ks{j}.k",
                [*condition_params, queue],
            ),
            CLAIM_ORDER,
            (f"{share} * {weight}", [n, n, *weight_params]),
            (f"{share} * {int(most)}", [n, n]),
        )
        ctes.append(f"""fk{j} AS (
            SELECT {picked}, ks{j}.pos AS pos,
                   row_number() OVER (PARTITION BY ks{j}.k ORDER BY {C_ORDER}) * 1.0 / {weight}
                       AS turn
            FROM {source}
        )""")
        params += [*weight_params, *source_params]
        branches.append(f"SELECT * FROM fk{j}")
        # The queue's items without a key take one more turn. Ordered by the key too
        # (NULL), which only the fair index gives without a sort: otherwise the planner
        # may walk the claim index past every keyed item of the queue.
        ctes.append(f"""fn{j} AS (
            SELECT l.*, {LAST_TURN - 1} AS pos,
                   row_number() OVER (ORDER BY {order}) * 1.0 AS turn
            FROM (
                SELECT {columns} FROM work_items
                WHERE {condition} AND queue_name = %s AND fairness_key IS NULL
                ORDER BY fairness_key, {CLAIM_ORDER} LIMIT %s {lock}
            ) AS l
        )""")
        params += [*condition_params, queue, n]
        branches.append(f"SELECT * FROM fn{j}")
    if fairness.others:
        fair_sql, fair_params = d.in_list("queue_name", list(fairness.fair))
        ctes.append(f"""fo AS (
            SELECT l.*, {LAST_TURN} AS pos, row_number() OVER (ORDER BY {order}) * 1.0 AS turn
            FROM (
                SELECT {columns} FROM work_items
                WHERE {condition} AND NOT ({fair_sql})
                ORDER BY {CLAIM_ORDER} LIMIT %s {lock}
            ) AS l
        )""")
        params += [*condition_params, *fair_params, n]
        branches.append("SELECT * FROM fo")
    rows = " UNION ALL ".join(branches)
    if limits:
        if limits.work_types:
            rows = trim_to_room(rows, PauseKind.WORK_TYPE.value, "work_type", TURN_ORDER)
        if limits.queues:
            rows = trim_to_room(rows, PauseKind.QUEUE.value, "queue_name", TURN_ORDER)
    ctes.append(f"""candidate AS (
        SELECT {address}, queue_name, fairness_key, pos, turn FROM ({rows}) AS t
        ORDER BY {TURN_ORDER} LIMIT %s
    )""")
    params.append(n)
    return "RECURSIVE " + ", ".join(ctes), params


def next_cursors(
    fairness: Fairness, claimed: Sequence[tuple[str, str | None, int | None]]
) -> dict[str, str]:
    """Each fair queue's new cursor: the key, among the (queue, key, pos) claimed, that came
    last in the rotation (unchanged where nothing with a key was claimed).

    `pos` None (SQLite, whose UPDATE cannot return the candidates' places): the
    rotation is code-point order from the cursor, which is SQLite's own order.
    """
    cursors = dict(fairness.queues)
    last: dict[str, tuple[Any, str]] = {}
    for queue, key, pos in claimed:
        if key is None or queue not in cursors or (pos is not None and pos >= LAST_TURN - 1):
            continue
        place = pos if pos is not None else (key <= cursors[queue], key)
        if queue not in last or place > last[queue][0]:
            last[queue] = (place, key)
    return {queue: key for queue, (_, key) in last.items()}
