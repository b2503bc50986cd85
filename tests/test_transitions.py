"""The state machine's table (`leasing.transitions`) and the guard that holds the code to it."""

from __future__ import annotations

import pytest

from leasing import LeaseManager, enqueue, transitions
from leasing.models import WorkItem
from leasing.transitions import GONE, GUARDS, NEW, RESTING, TRANSITIONS, allowed_moves
from tests import transition_guard
from tests.transition_guard import arranging


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


@pytest.mark.django_db
def test_the_guard_records_a_move_the_table_does_not_declare_and_not_an_arranged_one():
    item = enqueue("t", "noop")
    with arranging():
        WorkItem.objects.filter(pk=item.pk).update(status="completed")
    assert transition_guard.violations() == []

    other = enqueue("u", "noop")
    WorkItem.objects.filter(pk=other.pk).update(status="completed")  # pending -> completed
    assert transition_guard.violations() == [("pending -> completed", other.pk)]
    transition_guard.clear()  # or this test fails at teardown, as it should


@pytest.mark.django_db
def test_the_guard_lets_declared_moves_through():
    item = enqueue("t", "noop")
    manager = LeaseManager("w")
    manager.acquire_lease()
    manager.release_lease(item.pk, True)
    assert transition_guard.violations() == []


def test_the_model_test_drives_every_declared_transition():
    """A transition the table declares is not done until the model test drives it."""
    from tests.model.reference import DRIVEN_BY
    from tests.test_state_model import LeasingMachine

    assert set(DRIVEN_BY) == {t.name for t in TRANSITIONS}
    for transition, rule in DRIVEN_BY.items():
        assert callable(getattr(LeasingMachine, rule, None)), (transition, rule)
