"""The state machine's table (`leasing.transitions`) and the guard that holds the code to it."""

from __future__ import annotations

import pytest

from leasing import transitions
from leasing.transitions import GONE, GUARDS, NEW, RESTING, TRANSITIONS, allowed_moves


def _touches(transition: transitions.Transition, statuses: tuple[str, ...]) -> bool:
    return bool(set(transition.sources + transition.targets) & set(statuses))


@pytest.mark.parametrize("guard", GUARDS, ids=lambda g: g.feature)
def test_every_feature_states_its_rule_on_every_transition_that_touches_its_statuses(guard):
    names = {t.name for t in TRANSITIONS}
    assert set(guard.rules) <= names, f"{guard.feature} names transitions that do not exist"
    missing = [
        t.name for t in TRANSITIONS if _touches(t, guard.statuses) and t.name not in guard.rules
    ]
    assert not missing, f"{guard.feature} says nothing about {missing}"


def test_the_table_moves_only_between_known_statuses_and_never_into_expired():
    statuses = {*RESTING, NEW, GONE}
    for move in allowed_moves():
        assert set(move) <= statuses, move
    assert all("expired" not in t.targets for t in TRANSITIONS)
    assert {t.name for t in TRANSITIONS} == {t.name for t in {*TRANSITIONS}}  # names unique


def test_sets_refuses_a_target_the_transition_does_not_declare():
    with pytest.raises(ValueError):
        transitions.CLAIM.sets({transitions.FAILED: "1 = 1"})
    with pytest.raises(ValueError):
        transitions.FAIL_ATTEMPT.sets()  # two targets need a condition
    with pytest.raises(ValueError):
        transitions.FAIL_ATTEMPT.sets({transitions.PENDING: "x"})  # cancelled left undecided
    assert transitions.FAIL_ATTEMPT.sets(
        {transitions.PENDING: "x", transitions.CANCELLED: "y"}
    ) == ("status = CASE WHEN x THEN 'pending' WHEN y THEN 'cancelled' ELSE 'failed' END")


def test_the_model_test_drives_every_declared_transition():
    """A transition the table declares is not done until the model test drives it."""
    from tests.model.reference import DRIVEN_BY
    from tests.model.rules import LeasingMachine

    assert set(DRIVEN_BY) == {t.name for t in TRANSITIONS}
    for transition, rule in DRIVEN_BY.items():
        assert callable(getattr(LeasingMachine, rule, None)), (transition, rule)
