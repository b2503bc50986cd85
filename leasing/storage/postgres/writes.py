"""PostgreSQL's writes of many rows at once, and the reads only it can make.

New items arrive in one `INSERT ... SELECT unnest(...)` (a fixed number of
parameters whatever the batch size) or, from `COPY_THRESHOLD` rows on, one
`COPY`; renewals of a process's leases in one statement; checkpoint
retention reads each task's doomed rows from its index.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from itertools import chain
from typing import TYPE_CHECKING, Any

from django.db import connections

from ...sql.checkpoints import resume_point, tasks_past_retention
from ...sql.new_items import COLUMNS, NEW_STATUS, NOTIFY_CHANNEL, RICH_COLUMNS, NewItem, RichRow
from ...sql.renewals import Renewal
from ...sql.rollups import BUCKET_SQL, finished_range
from ...sql.runner import Statement, to_datetime
from ...sql.work_items import COMPLETED, fence
from ...transitions import ENQUEUE

if TYPE_CHECKING:
    from . import PostgresStorage

# On a replica: replayed and received WAL, the age of the last replayed
# transaction, whether replay is paused (NULLs on a primary).
REPLICA_SQL = """
SELECT pg_is_in_recovery(),
       CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()::text END,
       CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn()::text END,
       CASE WHEN pg_is_in_recovery()
            THEN extract(epoch FROM now() - pg_last_xact_replay_timestamp()) END,
       CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() ELSE false END
"""
# On the primary: where its WAL ends now (NULL when it is itself in recovery).
PRIMARY_SQL = "SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_lsn()::text END"


def insert(items: list[NewItem]) -> Statement:
    """One INSERT for the whole batch that also wakes idle workers of its queues.

    Returns one row: the count and the creation time. Being one statement, it
    is atomic by itself: outside a transaction it is one round trip with its
    commit, where BEGIN, INSERT, NOTIFY and COMMIT took four (a row is
    claimable only once that commit returns, so each round trip between the
    INSERT and it delayed the item's start). The NOTIFY is delivered at commit,
    and not at all if the INSERT fails.
    """
    # Every row gets the same statement_timestamp() (the columns' default),
    # so one row comes back, not n.
    sql = f"""
        WITH inserted AS (
            INSERT INTO work_items ({COLUMNS})
            SELECT v.id, v.task_id, v.work_type, {NEW_STATUS}, v.priority, 0, 0,
                   v.max_retries, v.run_after, v.queue_name, v.input::jsonb, v.rate_key,
                   v.fairness_key
            FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::int[],
                        %s::timestamptz[], %s::text[], %s::text[], %s::text[], %s::text[])
                 AS v(id, task_id, work_type, priority, max_retries, run_after, queue_name, input,
                      rate_key, fairness_key)
            RETURNING 1
        )
        SELECT count(*) AS inserted, statement_timestamp() AS created_at,
               (SELECT count(pg_notify(%s, q)) FROM unnest(%s::text[]) AS q) AS notified
        FROM inserted
    """
    params: list[Any] = [
        [i.work_item_id for i in items],
        [i.task_id for i in items],
        [i.work_type for i in items],
        [i.priority for i in items],
        [i.max_retries for i in items],
        [i.run_after for i in items],
        [i.queue_name for i in items],
        [i.input_json for i in items],
        [i.rate_key for i in items],
        [i.fairness_key for i in items],
        NOTIFY_CHANNEL,
        sorted({i.queue_name for i in items}),
    ]
    return sql, params


def copy(using: str, items: Iterable[NewItem]) -> datetime | None:
    """load the batch with one COPY; returns the shared creation time.

    `items` may be a generator that validates as it goes: an exception from it
    aborts the COPY (psycopg sends the server a CopyFail) and propagates.
    """
    rows = iter(items)
    # The first row is taken before the COPY: its id reads the creation time
    # back, without a check on every row of the loop.
    first = next(rows, None)
    if first is None:
        return None
    connection = connections[using]
    connection.ensure_connection()
    # The driver's own cursor (Django's has no COPY); errors still become Django's.
    with connection.wrap_database_errors, connection.connection.cursor() as cursor:
        with cursor.copy(f"COPY work_items ({COLUMNS}) FROM STDIN") as copy:
            for i in chain((first,), rows):
                copy.write_row(
                    (
                        i.work_item_id,
                        i.task_id,
                        i.work_type,
                        ENQUEUE.targets[0],
                        i.priority,
                        0,
                        0,
                        i.max_retries,
                        i.run_after,
                        i.queue_name,
                        i.input_json,
                        i.rate_key,
                        i.fairness_key,
                    )
                )
        # `prepare=False`: no server-side prepared statement (transaction poolers drop them).
        cursor.execute(
            "SELECT created_at FROM work_items WHERE work_item_id = %s",
            [first.work_item_id],
            prepare=False,
        )
        row = cursor.fetchone()
    return to_datetime(row[0]) if row else None


def insert_rich(rows: list[RichRow], on_conflict: str, returning: str) -> Statement:
    """insert the rows, skipping those whose unique key is held (`on_conflict`).

    Returns the `returning` columns of each row inserted.
    """
    sql = f"""
        INSERT INTO work_items ({RICH_COLUMNS})
        SELECT v.id, v.task_id, v.work_type, {NEW_STATUS}, v.priority, 0, 0,
               v.max_retries, v.run_after, v.queue_name, v.input::jsonb, v.rate_key,
               v.fairness_key, v.unique_key, v.unique_scope,
               CASE WHEN v.period IS NULL THEN NULL
                    ELSE statement_timestamp() + make_interval(secs => v.period) END,
               v.dependencies_left, v.has_dependents, v.on_failure
        FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::int[],
                    %s::timestamptz[], %s::text[], %s::text[], %s::text[], %s::text[],
                    %s::text[], %s::text[], %s::float8[], %s::int[], %s::boolean[], %s::text[])
             AS v(id, task_id, work_type, priority, max_retries, run_after, queue_name, input,
                  rate_key, fairness_key, unique_key, unique_scope, period, dependencies_left,
                  has_dependents, on_failure)
        {on_conflict}
        RETURNING {returning}
    """
    items = [r.item for r in rows]
    params: list[Any] = [
        [i.work_item_id for i in items],
        [i.task_id for i in items],
        [i.work_type for i in items],
        [i.priority for i in items],
        [i.max_retries for i in items],
        [i.run_after for i in items],
        [i.queue_name for i in items],
        [i.input_json for i in items],
        [i.rate_key for i in items],
        [i.fairness_key for i in items],
        [i.unique_key for i in items],
        [i.unique_scope for i in items],
        [i.unique_seconds for i in items],
        [r.dependencies_left for r in rows],
        [r.has_dependents for r in rows],
        [i.on_dependency_failure for i in items],
    ]
    return sql, params


def renew_batch(d: PostgresStorage, holder: str, renewals: list[Renewal]) -> Statement:
    """renew many leases in one statement; rows `(id, token, expiry, lost)`.

    A lease with more than `extend_below` seconds left keeps its expiry and
    only records the heartbeat: an UPDATE that leaves the indexed expiry alone
    can be a HOT update (no index writes).

    The rows are locked first, skipping any that another transaction holds
    (the process's own completion of a finished item, a checkpoint's fence).
    A renewal that waited there, holding the rest of its batch, deadlocked
    with a completion locking the same rows in another order: both waited a
    second for the deadlock detector, and the renewal round failed. The rows
    come back renewed, or `lost` when the statement's snapshot shows the lease
    no longer live (expired, past its deadline, moved on); a skipped lease is
    neither, and the next round renews it if it is still held. Every join
    follows a key or a row address, so stale statistics (a claim moments ago)
    cannot turn one into a loop over the whole batch.
    """

    def live(token: str) -> str:
        return f"{fence('w', token=token)} AND w.lease_expires_at > {d.now}"

    sql = f"""
        WITH v AS (
            SELECT * FROM unnest(%s::text[], %s::bigint[], %s::float8[], %s::float8[],
                                 %s::float8[]) AS v(id, token, duration, below, age)
        ), locked AS (
            SELECT w.ctid, v.token, v.duration, v.below, v.age
            FROM work_items AS w JOIN v ON w.work_item_id = v.id
            WHERE {live("v.token")}
            FOR NO KEY UPDATE OF w SKIP LOCKED
        ), renewed AS (
            -- A row locked by this statement cannot move: its address still holds.
            UPDATE work_items AS w
            SET lease_expires_at = CASE
                    WHEN w.lease_expires_at < {d.now} + make_interval(secs => l.below)
                    THEN LEAST({d.now} + make_interval(secs => l.duration), w.lease_deadline_at)
                    ELSE w.lease_expires_at END,
                heartbeat_at = {d.now}, updated_at = {d.now},
                progress_at = CASE WHEN l.age IS NULL THEN w.progress_at
                                   ELSE {d.now} - make_interval(secs => l.age) END
            FROM locked AS l
            WHERE w.ctid = l.ctid AND {live("l.token")}
            RETURNING w.work_item_id, w.lease_token, w.lease_expires_at
        )
        SELECT work_item_id, lease_token, lease_expires_at, FALSE AS lost FROM renewed
        UNION ALL
        SELECT v.id, v.token, NULL, TRUE FROM v
        WHERE NOT EXISTS (SELECT 1 FROM work_items AS w WHERE w.work_item_id = v.id
                          AND {live("v.token")})
    """
    params: list[Any] = [
        [r.work_item_id for r in renewals],
        [r.token for r in renewals],
        [r.duration for r in renewals],
        [r.extend_below for r in renewals],
        [r.progress_age for r in renewals],
        holder,
        holder,
        holder,
    ]
    return sql, params


def trim_checkpoints(d: PostgresStorage, retention: int, since: datetime | None) -> Statement:
    """Delete each task's checkpoints beyond its newest `retention` (`tasks_past_retention`).

    Each task's doomed rows are read from its index, newest first past the
    `retention` it keeps, and locked with SKIP LOCKED, so several sweeps
    cleaning at once split the work instead of waiting.
    """
    tasks, params = tasks_past_retention(d, retention, since)
    # ARRAY(...) runs each level once, then fetches by primary key,
    # whatever the planner guesses of how many rows it holds.
    doomed = f"""
        SELECT x.checkpoint_id FROM ({tasks}) AS n
        CROSS JOIN LATERAL (
            SELECT checkpoint_id FROM checkpoints AS c WHERE c.task_id = n.task_id
            ORDER BY c.sequence_number DESC OFFSET %s
        ) AS x
    """
    sql = f"""
        DELETE FROM checkpoints WHERE checkpoint_id = ANY(ARRAY(
            SELECT checkpoint_id FROM checkpoints
            WHERE checkpoint_id = ANY(ARRAY({doomed})) AND NOT {resume_point("checkpoints")}
            FOR UPDATE SKIP LOCKED))
        RETURNING checkpoint_id
    """
    return sql, [*params, retention]


# Seconds in a quarter of an hour (`finished_groups`).
QUARTER_SECONDS = 900


def finished_groups(
    d: PostgresStorage, start: datetime, end: datetime | None, step: timedelta, origin: datetime
) -> Statement:
    """The items finished in [start, end), grouped per bucket of `step` from `origin`.

    `quarter` (0-3) is the quarter of the hour, which places the items in a
    local hour of any time zone. When every bucket lies inside one quarter
    hour (the console's windows shorter than a day), it is the bucket's and is
    computed once per group instead of once per item. Seconds are read with
    `date_part` (float8): `extract` computes a numeric, several times slower
    over a window's rows.
    """
    where, params = finished_range(d, start, end)
    seconds = step.total_seconds()
    per_bucket = (
        seconds > 0 and QUARTER_SECONDS % seconds == 0 and origin.timestamp() % seconds == 0
    )
    quarter = "floor(date_part('epoch', {}))::bigint %% 3600 / 900"
    grouped = f"""
        SELECT date_bin(%s, completed_at, %s) AS bucket,
               {"0" if per_bucket else quarter.format("completed_at")} AS quarter,
               queue_name, work_type, status, retry_count, {BUCKET_SQL} AS run_bucket,
               count(*) AS n, coalesce(sum(run), 0) AS run_seconds
        FROM (SELECT completed_at, queue_name, work_type, status, retry_count,
                     CASE WHEN status = {COMPLETED} AND lease_acquired_at IS NOT NULL
                          THEN greatest(date_part('epoch', completed_at - lease_acquired_at), 0)
                     END AS run
              FROM work_items WHERE {where}) AS finished
        GROUP BY 1, 2, 3, 4, 5, 6, 7
    """
    sql = grouped
    if per_bucket:
        sql = f"""
            SELECT bucket, {quarter.format("bucket")} AS quarter, queue_name, work_type, status,
                   retry_count, run_bucket, n, run_seconds
            FROM ({grouped}) AS groups
        """
    return sql, [step, origin, *params]
