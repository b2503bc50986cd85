"""No lease is immortal: a deadline on the database clock caps every lease.

A lease's deadline (`lease_deadline_at`) is fixed when it is claimed: the
handler's `timeout` or `MAX_LEASE_LIFETIME`. No renewal moves the expiry past
it, so even a process that keeps renewing (a wedged handler in `thread` mode)
loses the lease; the worker times the run out itself, and the sweep does it
for a process that cannot.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from leasing import LeaseManager, RecoverySweep
from leasing.exceptions import LeaseExpiredError
from leasing.models import Checkpoint, WorkItem
from leasing.services.terms import claim_filters, claim_terms
from tests.support.helpers import database_now

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_claim_sets_the_deadline_from_max_lease_lifetime(make_items, leasing_settings):
    leasing_settings(MAX_LEASE_LIFETIME=600)
    [item] = make_items(1)
    lease = LeaseManager("w").acquire_lease(lease_duration_seconds=60)
    row = WorkItem.objects.get(pk=item.pk)
    assert row.lease_deadline_at - row.lease_acquired_at == timedelta(seconds=600)
    assert lease.deadline_at == row.lease_deadline_at and lease.cap_seconds == 600


def test_no_renewal_moves_a_lease_past_its_deadline(make_items):
    [item] = make_items(1)
    manager = LeaseManager("w")
    [lease] = manager.claim(1, claim_terms(1.0, cap_seconds=1.5), claim_filters())
    manager.renew_lease(item.pk, 600)
    row = WorkItem.objects.get(pk=item.pk)
    assert row.lease_expires_at == row.lease_deadline_at  # capped, not now + 600 s
    time.sleep(1.6)
    with pytest.raises(LeaseExpiredError, match="reached its deadline"):
        manager.renew_lease(item.pk, 600, token=lease.token)


def test_the_sweep_reports_a_lease_that_ran_into_its_deadline_as_a_time_out(make_items):
    [item] = make_items(1, max_retries=2)
    LeaseManager("wedged").claim(1, claim_terms(60, cap_seconds=90), claim_filters())
    # A wedged process renewed it up to its deadline, which has now passed.
    WorkItem.objects.filter(pk=item.pk).update(
        lease_acquired_at=database_now() - timedelta(seconds=91),
        lease_deadline_at=database_now() - timedelta(seconds=1),
        lease_expires_at=database_now() - timedelta(seconds=1),
    )
    stats = RecoverySweep().scan_and_recover()
    assert stats.recovered == 1
    row = WorkItem.objects.get(pk=item.pk)
    assert (row.status, row.retry_count) == ("pending", 1)
    assert row.error_message == "Timed out after 90 s - retry 1/2"
    boundary = Checkpoint.objects.get(task_id=item.task_id)
    assert boundary.snapshot_data["reason"] == "timed_out"


def test_a_per_type_lifetime_caps_the_claim(make_items):
    from leasing.handlers import build_spec

    spec = build_spec("x", lambda ctx: None, timeout=30, max_lease_lifetime=20)
    assert spec.cap_seconds(14400) == 20
    assert build_spec("x", lambda ctx: None, timeout=30).cap_seconds(14400) == 30
    assert build_spec("x", lambda ctx: None).cap_seconds(14400) == 14400
