"""The fault run's checker (tests/faults/checker.py) fails on each kind of violation.

Hand-made histories: one where every property holds, then the same history
with one fault planted per test. The run itself (`make test-faults`) only ever
shows the checker passing; these show that it can fail, and on what.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.faults.checker import (
    PROPERTIES,
    Evidence,
    Rules,
    check,
    dependency_order,
    double_effects,
    double_ticks,
    limits_exceeded,
    non_terminal,
    renewals_past_cap,
    stale_completions,
    unrecovered_expiries,
)
from tests.faults.lease_times import SECOND
from tests.faults.records import Change, Edge, Effect, FinalItem, Record

LIMITS = {"limited": 1}
CAPS = {"capped": 3.0}
DEFAULT_CAP = 60.0

_seq = iter(range(1, 1_000_000))


def at(seconds: float) -> int:
    return round(seconds * SECOND)


def change(item: str, when: float, old: str | None, new: str | None, **fields: Any) -> Change:
    values: dict[str, Any] = {
        "seq": next(_seq),
        "at": at(when),
        "stmt": at(when),
        "op": "UPDATE" if old and new else ("INSERT" if new else "DELETE"),
        "item": item,
        "work_type": "plain",
        "queue": "default",
        "old_status": old,
        "new_status": new,
        "old_token": None,
        "new_token": None,
        "old_holder": None,
        "new_holder": None,
        "old_expires": None,
        "new_expires": None,
        "deadline": None,
        "acquired": None,
    }
    values.update(fields)
    return Change(**values)


def claim(item: str, when: float, token: int, worker: str, **fields: Any) -> Change:
    cap = CAPS.get(fields.get("work_type", "plain"), DEFAULT_CAP)
    lease = {
        "old_token": token - 1,
        "new_token": token,
        "new_holder": worker,
        "acquired": at(when),
        "new_expires": at(when + min(4.0, cap)),
        "deadline": at(when + cap),
    }
    return change(item, when, "pending", "in_progress", **{**lease, **fields})


def end(item: str, when: float, token: int, worker: str, status: str, **fields: Any) -> Change:
    return change(
        item,
        when,
        "in_progress",
        status,
        old_token=token,
        new_token=token,
        old_holder=worker,
        **fields,
    )


def renewal(item: str, when: float, token: int, worker: str, old: float, new: float) -> Change:
    return change(
        item,
        when,
        "in_progress",
        "in_progress",
        old_token=token,
        new_token=token,
        old_holder=worker,
        new_holder=worker,
        old_expires=at(old),
        new_expires=at(new),
        deadline=at(1.0 + DEFAULT_CAP),  # the claim's (these items are claimed at 1 s)
    )


def done(item: str, token: int, worker: str, **fields: Any) -> FinalItem:
    output = {"token": token, "worker": worker}
    return FinalItem(item, "plain", "default", "completed", token, output, **fields)


def good_evidence() -> Evidence:
    changes = [
        # a: claimed, renewed, completed.
        change("a", 0.0, None, "pending", new_token=0),
        claim("a", 1.0, 1, "w1"),
        renewal("a", 2.0, 1, "w1", old=5.0, new=6.0),
        end("a", 3.0, 1, "w1", "completed"),
        # b: its first lease expires (the sweep re-queues it), the second completes.
        change("b", 0.0, None, "pending", new_token=0),
        claim("b", 1.0, 1, "w1"),
        end("b", 6.0, 1, "w1", "pending"),
        claim("b", 7.0, 2, "w2"),
        end("b", 8.0, 2, "w2", "completed"),
        # c depends on b.
        change("c", 0.0, None, "pending", new_token=0),
        claim("c", 8.5, 1, "w1"),
        end("c", 9.0, 1, "w1", "completed"),
        # Two items of the limited queue, one after the other.
        claim("l1", 10.0, 1, "w1", queue="limited"),
        end("l1", 11.0, 1, "w1", "completed", queue="limited"),
        claim("l2", 11.0, 1, "w2", queue="limited"),
        end("l2", 12.0, 1, "w2", "completed", queue="limited"),
        # A capped type: its deadline is 3 s after its claim.
        claim("k", 13.0, 1, "w1", work_type="capped"),
        end("k", 16.0, 1, "w1", "pending", work_type="capped"),
        claim("k", 17.0, 2, "w2", work_type="capped"),
        end("k", 17.5, 2, "w2", "completed", work_type="capped"),
        # Two ticks of a schedule.
        claim("t1", 20.0, 1, "w1"),
        end("t1", 20.5, 1, "w1", "completed"),
        claim("t2", 21.0, 1, "w2"),
        end("t2", 21.5, 1, "w2", "completed"),
    ]
    items = {
        "a": done("a", 1, "w1"),
        "b": done("b", 2, "w2"),
        "c": done("c", 1, "w1"),
        "l1": dataclasses.replace(done("l1", 1, "w1"), queue="limited"),
        "l2": dataclasses.replace(done("l2", 1, "w2"), queue="limited"),
        "k": dataclasses.replace(done("k", 2, "w2"), work_type="capped"),
        "t1": done("t1", 1, "w1", tick="2026-01-01T00:00:01", schedule="every"),
        "t2": done("t2", 1, "w2", tick="2026-01-01T00:00:02", schedule="every"),
    }
    effects = [
        Effect(1, "effect:a", "a", 1, "w1", at(2.5)),
        Effect(2, "effect:b", "b", 2, "w2", at(7.5)),
    ]
    records = [
        Record("claim", "a", 1, "w1"),
        Record("renew", "a", 1, "w1", expires=at(6.0)),
        Record("release", "a", 1, "w1", status="completed"),
        Record("claim", "b", 2, "w2"),
        Record("expire", "b", 1, "w1", status="pending"),
        Record("release", "b", 2, "w2", status="completed"),
    ]
    return Evidence(items, changes, effects, records, [Edge("b", "c")])


RULES = Rules(queue_limits=LIMITS, caps=CAPS, default_cap=DEFAULT_CAP, recovery_bound=5.0)


def test_a_good_history_passes_every_property() -> None:
    found, peaks = check(good_evidence(), RULES)
    assert found == {name: [] for name in PROPERTIES}
    assert [(p.queue, p.limit, p.peak, p.leases) for p in peaks] == [("limited", 1, 1, 2)]


def test_a_completion_from_a_stale_token_fails() -> None:
    evidence = good_evidence()
    # The run of token 1 (whose lease expired) stored its output: a stale completion.
    items = {**evidence.items, "b": done("b", 1, "w1")}
    found = stale_completions(items, evidence.changes, evidence.records)
    assert [(v.prop, v.item) for v in found] == [("stale_completion", "b")]
    assert "token 1 (w1)" in found[0].detail


def test_a_worker_told_its_stale_completion_was_accepted_fails() -> None:
    evidence = good_evidence()
    records = [*evidence.records, Record("release", "b", 1, "w1", status="completed")]
    found = stale_completions(evidence.items, evidence.changes, records)
    assert [v.item for v in found] == ["b"]
    assert "w1 was told its completion with token 1" in found[0].detail


def test_a_completion_under_an_older_token_than_the_last_claim_fails() -> None:
    evidence = good_evidence()
    changes = [c for c in evidence.changes if not (c.item == "b" and c.new_status == "completed")]
    # Token 1 completes b although token 2 claimed it since.
    changes.append(end("b", 8.0, 1, "w1", "completed"))
    items = {**evidence.items, "b": done("b", 1, "w1")}
    found = stale_completions(items, changes)
    assert found and all(v.item == "b" for v in found)
    assert any("the last claim was 2" in v.detail for v in found)


def test_a_claim_after_completion_fails() -> None:
    evidence = good_evidence()
    changes = [*evidence.changes, claim("a", 4.0, 2, "w2")]
    found = stale_completions(evidence.items, changes)
    assert any(v.item == "a" and "claimed again" in v.detail for v in found)


def test_a_claim_record_the_database_did_not_grant_fails() -> None:
    evidence = good_evidence()
    records = [*evidence.records, Record("claim", "b", 2, "w1")]  # w2 holds token 2
    found = stale_completions(evidence.items, evidence.changes, records)
    assert [v.item for v in found] == ["b"]


def test_an_effect_applied_twice_fails() -> None:
    evidence = good_evidence()
    effects = [*evidence.effects, Effect(3, "effect:b", "b", 1, "w1", at(6.5))]
    found = double_effects(effects, evidence.changes)
    assert [(v.prop, v.item) for v in found] == [("double_effect", "b")]
    assert "applied 2 times" in found[0].detail


def test_an_effect_under_a_lease_never_granted_fails() -> None:
    evidence = good_evidence()
    effects = [*evidence.effects, Effect(3, "effect:a2", "a", 7, "w9", at(2.5))]
    found = double_effects(effects, evidence.changes)
    assert [v.item for v in found] == ["a"]
    assert "never granted" in found[0].detail


def test_a_non_terminal_item_fails() -> None:
    evidence = good_evidence()
    stuck = FinalItem("d", "plain", "default", "in_progress", 3)
    waiting = FinalItem("e", "plain", "default", "pending", 0)
    found = non_terminal({**evidence.items, "d": stuck, "e": waiting})
    assert [(v.prop, v.item) for v in found] == [("not_terminal", "d"), ("not_terminal", "e")]


def test_a_renewal_past_the_deadline_fails() -> None:
    evidence = good_evidence()
    past = renewal("a", 2.5, 1, "w1", old=6.0, new=DEFAULT_CAP + 2)  # deadline: 61 s
    found = renewals_past_cap([*evidence.changes, past], evidence.records, CAPS, DEFAULT_CAP)
    assert [(v.prop, v.item) for v in found] == [("renewal_past_cap", "a")]
    assert "past its deadline" in found[0].detail


def test_a_renewal_of_an_expired_lease_fails() -> None:
    evidence = good_evidence()
    late = renewal("a", 5.5, 1, "w1", old=5.0, new=9.0)
    found = renewals_past_cap([*evidence.changes, late], evidence.records, CAPS, DEFAULT_CAP)
    assert [v.item for v in found] == ["a"]
    assert "after it expired" in found[0].detail


def test_a_deadline_beyond_the_types_cap_fails() -> None:
    evidence = good_evidence()
    long = claim("k", 30.0, 3, "w1", work_type="capped", deadline=at(30.0 + 10))
    found = renewals_past_cap([*evidence.changes, long], evidence.records, CAPS, DEFAULT_CAP)
    assert [v.item for v in found] == ["k"]
    assert "the cap of capped is 3" in found[0].detail


def test_a_renewal_record_past_the_deadline_fails() -> None:
    evidence = good_evidence()
    records = [*evidence.records, Record("renew", "a", 1, "w1", expires=at(DEFAULT_CAP + 5))]
    found = renewals_past_cap(evidence.changes, records, CAPS, DEFAULT_CAP)
    assert [v.item for v in found] == ["a"]


def test_a_limit_exceeded_fails() -> None:
    evidence = good_evidence()
    changes = [c for c in evidence.changes if c.item != "l2"]
    # l2 is claimed while l1 (limit 1) is still in progress.
    changes += [
        claim("l2", 10.5, 1, "w2", queue="limited"),
        end("l2", 12.0, 1, "w2", "completed", queue="limited"),
    ]
    found, peaks = limits_exceeded(changes, LIMITS)
    assert [(v.prop, v.item) for v in found] == [("limit_exceeded", "l2")]
    assert peaks[0].peak == 2


def test_a_double_tick_fails() -> None:
    evidence = good_evidence()
    twin = done("t3", 1, "w2", tick="2026-01-01T00:00:01", schedule="every")
    found = double_ticks({**evidence.items, "t3": twin})
    assert [(v.prop, v.item) for v in found] == [("double_tick", "t1")]
    assert "t3" in found[0].detail


def test_a_dependent_claimed_before_its_dependency_completed_fails() -> None:
    evidence = good_evidence()
    changes = [c for c in evidence.changes if c.item != "c"]
    changes.append(claim("c", 7.5, 1, "w1"))  # b completes at 8 s
    found = dependency_order(evidence.edges, changes)
    assert [(v.prop, v.item) for v in found] == [("dependency_order", "c")]


def test_an_expired_lease_left_unrecovered_past_the_bound_fails() -> None:
    evidence = good_evidence()
    _, longest = unrecovered_expiries(evidence.changes, 5.0)
    assert longest == at(1.0)  # b's first lease: expired at 5 s, re-queued at 6 s
    # s's lease expires at 34 s; nothing recovers it until 45 s.
    changes = [*evidence.changes, claim("s", 30.0, 1, "w1"), end("s", 45.0, 1, "w1", "pending")]
    found, longest = unrecovered_expiries(changes, 5.0)
    assert [(v.prop, v.item) for v in found] == [("unrecovered_expiry", "s")]
    assert longest == at(11.0)
    assert "stayed in progress 11.0 s" in found[0].detail


def test_an_expired_lease_still_in_progress_at_the_end_fails() -> None:
    evidence = good_evidence()
    changes = [*evidence.changes, claim("s", 30.0, 1, "w1")]  # expires at 34 s
    assert unrecovered_expiries(changes, 5.0, observed_at=at(38.0))[0] == []
    found, longest = unrecovered_expiries(changes, 5.0, observed_at=at(40.0))
    assert [(v.prop, v.item) for v in found] == [("unrecovered_expiry", "s")]
    assert "still was at the end" in found[0].detail and longest == at(6.0)


@pytest.mark.parametrize("prop", sorted(PROPERTIES))
def test_check_reports_each_property_by_name(prop: str) -> None:
    """`check()` files each planted fault under its own property and no other."""
    evidence = good_evidence()
    planted = {
        "stale_completion": lambda e: dataclasses.replace(
            e, items={**e.items, "b": done("b", 1, "w1")}
        ),
        "double_effect": lambda e: dataclasses.replace(
            e, effects=[*e.effects, Effect(3, "effect:a", "a", 1, "w1", at(2.6))]
        ),
        "not_terminal": lambda e: dataclasses.replace(
            e, items={**e.items, "z": FinalItem("z", "plain", "default", "pending", 0)}
        ),
        "renewal_past_cap": lambda e: dataclasses.replace(
            e, records=[*e.records, Record("renew", "a", 1, "w1", expires=at(99.0))]
        ),
        "limit_exceeded": lambda e: dataclasses.replace(
            e, changes=[*e.changes, claim("l3", 10.2, 1, "w3", queue="limited")]
        ),
        "double_tick": lambda e: dataclasses.replace(
            e,
            items={**e.items, "t2": dataclasses.replace(e.items["t2"], tick=e.items["t1"].tick)},
        ),
        "dependency_order": lambda e: dataclasses.replace(e, edges=[*e.edges, Edge("z9", "a")]),
        "unrecovered_expiry": lambda e: dataclasses.replace(
            e,
            changes=[*e.changes, claim("s", 30.0, 1, "w1"), end("s", 45.0, 1, "w1", "pending")],
        ),
    }[prop](evidence)
    found, _ = check(planted, RULES)
    assert {name for name, violations in found.items() if violations} == {prop}
