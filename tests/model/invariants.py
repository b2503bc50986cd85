"""The model test's checks after every step: the invariants, and the rows against the model."""

from __future__ import annotations

from typing import Any

from . import database as db
from .reference import (
    CANCELLED,
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    PENDING,
    PERIOD,
    STATUSES,
    Reference,
)


def check_invariants(
    rows: dict[str, dict[str, Any]], edges: set[tuple[str, str]], ref: Reference
) -> None:
    """The invariants of the decided semantics, read from the database alone."""
    moves = db.undeclared_moves()
    assert not moves, f"moves leasing.transitions does not declare: {moves}"
    holders: dict[tuple[str, str], list[str]] = {}
    in_flight: dict[tuple[str, str], int] = {}
    for item_id, row in rows.items():
        status = row["status"]
        assert status in STATUSES, f"{item_id}: status {status!r} is not in the table"
        leased = (row["lease_holder"], row["lease_expires_at"])
        assert (status == IN_PROGRESS) == (leased[0] is not None), f"{item_id}: {row}"
        assert (status == IN_PROGRESS) == (leased[1] is not None), f"{item_id}: {row}"
        assert row["retry_count"] <= row["max_retries"], f"{item_id}: {row}"
        if status in (COMPLETED, FAILED, CANCELLED):
            assert row["completed_at"] is not None, f"{item_id} finished without completed_at"
        if status == PENDING:
            assert row["cancel_requested_at"] is None, f"{item_id}: pending, asked to stop"
        scope = row["unique_scope"]
        if scope == PERIOD:
            holding = bool(row["period_live"])
        else:
            holding = status == PENDING or (status == IN_PROGRESS and scope == "unfinished")
        if holding and row["unique_key"] is not None:
            holders.setdefault((row["unique_key"], scope), []).append(item_id)
        if status == IN_PROGRESS:
            for kind in ("queue_name", "work_type"):
                in_flight[kind, row[kind]] = in_flight.get((kind, row[kind]), 0) + 1
        if status == PENDING:
            left = sum(
                1
                for dep, dependent in edges
                if dependent == item_id and rows[dep]["status"] != COMPLETED
            )
            assert row["dependencies_left"] == left, (
                f"{item_id}: dependencies_left {row['dependencies_left']}, "
                f"but {left} of its dependencies are not completed"
            )
    for key, ids in holders.items():
        assert len(ids) == 1, f"key {key} held by {ids}"
    limits = {("queue_name", q): n for q, n in ref.queue_limits.items()}
    limits.update({("work_type", t): n for t, n in ref.type_limits.items()})
    for key, limit in limits.items():
        assert in_flight.get(key, 0) <= limit, f"{key}: {in_flight.get(key)} in flight > {limit}"


def compare_with_model(
    rows: dict[str, dict[str, Any]], edges: set[tuple[str, str]], ref: Reference
) -> None:
    """Every row as the model has it: status, holder, token, counters, availability, key."""
    rows, edges = db.rows(), db.edges()
    check_invariants(rows, edges, ref)
    assert set(rows) == set(ref.items), (
        f"lost: {set(ref.items) - set(rows)}; unexpected: {set(rows) - set(ref.items)}"
    )
    assert edges == ref.edges()
    for item in ref.items.values():
        row = rows[item.id]
        seen = (
            row["status"],
            row["lease_holder"],
            row["lease_token"],
            row["dependencies_left"],
        )
        wanted = (item.status, item.holder, item.token, item.dependencies_left)
        assert seen == wanted, f"{item.id}: database {seen}, model {wanted}"
        if item.status == PENDING:
            assert bool(row["ready"]) == item.ready, f"{item.id}: run_after {row}"
        if item.status == IN_PROGRESS:
            assert bool(row["expired"]) == item.expired, item.id
            asked = row["cancel_requested_at"] is not None
            assert asked == item.cancel_requested, f"{item.id}: asked to stop {asked}, model {item}"
        if item.superseded_by is None:
            assert row["retry_count"] == item.retry_count, f"{item.id}: {row}, model {item}"
        else:
            assert (row["error_message"] or "").startswith(f"Superseded by {item.superseded_by}"), (
                row["error_message"]
            )
