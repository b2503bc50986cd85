"""The properties a fault run must keep, checked over its records afterwards.

Each check is a pure function of the run's records (`tests.faults.records`)
and returns the violations it found; none of them reads a clock or a
database, so a test can hand them made-up histories (tests/unit/test_fault_checker.py).

The journal of committed changes is the ground truth for what the database
did; the stored outputs, the effect ledger and the processes' signal records
say who did it, and each is checked against the journal.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .lease_times import (
    as_seconds,
    claims_by_lease,
    renewals_past_cap,
    unrecovered_expiries,
)
from .records import IN_PROGRESS, TERMINAL, Change, Edge, Effect, FinalItem, Record, Violation

PROPERTIES = {
    "stale_completion": "no completion accepted from a stale token",
    "double_effect": "no atomic effect applied twice",
    "not_terminal": "every item terminal once the faults stop",
    "renewal_past_cap": "no lease renewed past its cap",
    "limit_exceeded": "no concurrency limit exceeded",
    "double_tick": "one item per schedule tick",
    "dependency_order": "no dependent claimed before its dependencies completed",
    "unrecovered_expiry": "every expired lease recovered by the sweep within a bound",
}


def history(changes: Iterable[Change]) -> dict[str, list[Change]]:
    """Each item's changes in the order they were made."""
    by_item: dict[str, list[Change]] = defaultdict(list)
    for change in sorted(changes, key=lambda c: (c.at, c.seq)):
        by_item[change.item].append(change)
    return by_item


# --- no completion accepted from a stale token -------------------------------------------


def stale_completions(
    items: Mapping[str, FinalItem], changes: Iterable[Change], records: Iterable[Record] = ()
) -> list[Violation]:
    """The token that completed an item is the last token that claimed it.

    Checked three ways: the journal (one completion, no claim after it, under
    the newest token); the stored output, which the completing run stamps with
    its own token and worker (a stale run's output would carry its older
    token); and what each worker was told (a completion or claim it heard of
    must be the one the database recorded, with that holder).
    """
    changes = list(changes)
    found: list[Violation] = []
    by_item = history(changes)
    completions: dict[str, Change] = {}

    def flag(item: str, detail: str) -> None:
        found.append(Violation("stale_completion", item, detail))

    for item_id, log in by_item.items():
        for change in log:
            if change.old_status == "completed" and change.op != "DELETE":
                flag(item_id, f"left completed for {change.new_status} (token {change.new_token})")
        done = [c for c in log if c.new_status == "completed" and c.old_status != "completed"]
        if len(done) > 1:
            flag(item_id, f"completed {len(done)} times (tokens {[c.old_token for c in done]})")
        if done:
            completions[item_id] = done[-1]
    for item in items.values():
        if item.status != "completed":
            continue
        done = completions.get(item.item)
        if done is None:
            flag(item.item, "completed, but the journal has no completion")
            continue
        if done.old_status != IN_PROGRESS:
            flag(item.item, f"completed from {done.old_status}, not under a lease")
            continue
        claims = [c for c in by_item[item.item] if c.is_claim]
        later = [c.new_token for c in claims if c.at > done.at]
        if later:
            flag(item.item, f"claimed again after its completion (tokens {later})")
        newest = max((c.new_token or 0 for c in claims), default=None)
        if newest != done.old_token:
            flag(item.item, f"completed under token {done.old_token}, the last claim was {newest}")
        holders = {c.new_token: c.new_holder for c in claims}
        stamp = item.output if isinstance(item.output, dict) else {}
        if (stamp.get("token"), stamp.get("worker")) != (
            done.old_token,
            holders.get(done.old_token),
        ):
            flag(
                item.item,
                f"its stored output came from the run of token {stamp.get('token')} "
                f"({stamp.get('worker')}), but token {done.old_token} "
                f"({holders.get(done.old_token)}) completed it",
            )
    granted = claims_by_lease(changes)
    for record in records:
        if record.kind == "release" and record.status == "completed":
            done = completions.get(record.item)
            if done is None or (done.old_token, done.old_holder) != (record.token, record.worker):
                what = (
                    "did not complete"
                    if done is None
                    else (f"was completed by token {done.old_token} ({done.old_holder})")
                )
                flag(
                    record.item,
                    f"{record.worker} was told its completion with token {record.token} "
                    f"was accepted, but the item {what}",
                )
        elif record.kind == "claim":
            claim = granted.get((record.item, record.token))
            if claim is None or claim.new_holder != record.worker:
                holder = "nobody" if claim is None else claim.new_holder
                flag(
                    record.item,
                    f"{record.worker} was told it claimed token {record.token}; the database "
                    f"granted it to {holder}",
                )
    return found


# --- no atomic effect applied twice --------------------------------------------------------


def double_effects(effects: Iterable[Effect], changes: Iterable[Change]) -> list[Violation]:
    """Each effect key has one ledger row, written under a lease the database granted."""
    found: list[Violation] = []
    by_key: dict[str, list[Effect]] = defaultdict(list)
    effects = list(effects)
    for effect in effects:
        by_key[effect.key].append(effect)
    for key, rows in sorted(by_key.items()):
        if len(rows) > 1:
            runs = ", ".join(f"token {e.token} ({e.worker}) row {e.seq}" for e in rows)
            found.append(
                Violation("double_effect", rows[0].item, f"{key} applied {len(rows)} times: {runs}")
            )
    granted = claims_by_lease(changes)
    for effect in effects:
        claim = granted.get((effect.item, effect.token))
        if claim is None or claim.new_holder != effect.worker:
            found.append(
                Violation(
                    "double_effect",
                    effect.item,
                    f"{effect.key} applied by {effect.worker} under token {effect.token}, "
                    "a lease the database never granted it",
                )
            )
    return found


# --- every item terminal -----------------------------------------------------------------


def non_terminal(items: Mapping[str, FinalItem]) -> list[Violation]:
    return [
        Violation(
            "not_terminal", item.item, f"{item.status} ({item.work_type}, token {item.token})"
        )
        for item in items.values()
        if item.status not in TERMINAL
    ]


# --- no concurrency limit exceeded --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Peak:
    queue: str
    limit: int
    peak: int  # the most (item, token) leases in progress at once
    leases: int  # leases granted in the queue


def limits_exceeded(
    changes: Iterable[Change], limits: Mapping[str, int]
) -> tuple[list[Violation], list[Peak]]:
    """Replay each limited queue's claims and lease ends in the order the database
    made them: at no moment more leases in progress than the limit.

    A claim of a limited queue runs after taking the queue's advisory lock and
    counts from a snapshot taken after it, so every end it saw was written
    before it: replaying by the time each change was written never shows more
    in progress than the claim counted. At one instant, ends go first.
    """
    changes = list(changes)
    found: list[Violation] = []
    peaks: list[Peak] = []
    for queue, limit in sorted(limits.items()):
        events = [
            (c.at, 0 if c.is_end else 1, c.seq, c)
            for c in changes
            if c.queue == queue and (c.is_claim or c.is_end)
        ]
        events.sort(key=lambda e: e[:3])
        flying: dict[str, int | None] = {}
        peak = granted = 0
        for at, kind, _, c in events:
            if kind == 0:
                flying.pop(c.item, None)
                continue
            granted += 1
            flying[c.item] = c.new_token
            peak = max(peak, len(flying))
            if len(flying) > limit:
                leases = ", ".join(f"{i}#{t}" for i, t in sorted(flying.items()))
                found.append(
                    Violation(
                        "limit_exceeded",
                        c.item,
                        f"queue {queue} (limit {limit}): {len(flying)} in progress at "
                        f"{as_seconds(at)} after token {c.new_token}: {leases}",
                    )
                )
        peaks.append(Peak(queue, limit, peak, granted))
    return found, peaks


# --- one item per schedule tick -----------------------------------------------------------


def double_ticks(items: Mapping[str, FinalItem]) -> list[Violation]:
    by_tick: dict[tuple[str, str], list[str]] = defaultdict(list)
    for item in items.values():
        if item.tick is not None:
            by_tick[(item.schedule or "", item.tick)].append(item.item)
    return [
        Violation("double_tick", ids[0], f"schedule {name} tick {tick} has items {sorted(ids)}")
        for (name, tick), ids in sorted(by_tick.items())
        if len(ids) > 1
    ]


# --- dependencies -------------------------------------------------------------------------


def dependency_order(edges: Iterable[Edge], changes: Iterable[Change]) -> list[Violation]:
    """A dependent is claimed only after each of its dependencies completed."""
    completed_at: dict[str, int] = {}
    claims: dict[str, list[Change]] = defaultdict(list)
    for c in changes:
        if c.new_status == "completed" and c.old_status != "completed":
            completed_at.setdefault(c.item, c.at)
        if c.is_claim:
            claims[c.item].append(c)
    found = []
    for edge in edges:
        finished = completed_at.get(edge.dependency)
        for claim in claims.get(edge.dependent, []):
            if finished is None or claim.at < finished:
                when = (
                    "never completed"
                    if finished is None
                    else f"completed at {as_seconds(finished)}"
                )
                found.append(
                    Violation(
                        "dependency_order",
                        edge.dependent,
                        f"claimed (token {claim.new_token}) at {as_seconds(claim.at)}; its "
                        f"dependency {edge.dependency} {when}",
                    )
                )
    return found


# --- all of them ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """Everything a run left, as the checks read it."""

    items: Mapping[str, FinalItem]
    changes: list[Change]
    effects: list[Effect]
    records: list[Record]
    edges: list[Edge]
    observed_at: int | None = None  # when it was read (database clock, microseconds)


@dataclass(frozen=True)
class Rules:
    """What the run was configured to keep."""

    queue_limits: Mapping[str, int]
    caps: Mapping[str, float]
    default_cap: float
    recovery_bound: float  # seconds an expired lease may wait for the sweep


def check(evidence: Evidence, rules: Rules) -> tuple[dict[str, list[Violation]], list[Peak]]:
    """Every property's violations (an empty list for each one kept) and the queues' peaks."""
    over_limit, peaks = limits_exceeded(evidence.changes, rules.queue_limits)
    stranded, _ = unrecovered_expiries(evidence.changes, rules.recovery_bound, evidence.observed_at)
    found = {
        "stale_completion": stale_completions(evidence.items, evidence.changes, evidence.records),
        "double_effect": double_effects(evidence.effects, evidence.changes),
        "not_terminal": non_terminal(evidence.items),
        "renewal_past_cap": renewals_past_cap(
            evidence.changes, evidence.records, rules.caps, rules.default_cap
        ),
        "limit_exceeded": over_limit,
        "double_tick": double_ticks(evidence.items),
        "dependency_order": dependency_order(evidence.edges, evidence.changes),
        "unrecovered_expiry": stranded,
    }
    assert set(found) == set(PROPERTIES)
    return found, peaks
