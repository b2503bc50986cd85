"""The work item state machine, checked against a reference model (issue 39).

Hypothesis drives the public API (enqueue with unique keys and dependencies,
LeaseManager claims and releases by several workers, operator actions,
pauses, purges) and the recovery sweep's pass, on the database DATABASE_URL
names, while `tests.model.reference.Reference` applies the decided semantics.
After every step each row is compared with the model and the invariants hold:
no item under two leases, a key held by at most one item, dependency counters
that match the edges, only the five statuses, nothing lost, retries within
their bound, limits never exceeded (and after a sweep, no expired lease left).

Time passes through the database clock: the tests move a lease's expiry, a
retry's run_after or a finished item's completed_at into the past.

Size: LEASING_MODEL_EXAMPLES examples (default 150) of up to
LEASING_MODEL_STEPS steps (default 50); `make test-model-long` runs thousands.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.rules import LeasingMachine

settings.register_profile(
    "leasing-model",
    max_examples=int(os.environ.get("LEASING_MODEL_EXAMPLES", "150")),
    stateful_step_count=int(os.environ.get("LEASING_MODEL_STEPS", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.django_db(transaction=True)
def test_state_machine_matches_the_model() -> None:
    run_state_machine_as_test(LeasingMachine, settings=settings.get_profile("leasing-model"))
