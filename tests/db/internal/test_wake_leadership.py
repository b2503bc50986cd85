"""One idle worker answers each wake (`leasing.worker.leadership`): real `runworker`
processes on PostgreSQL.

The workers poll every 30 s here, so an item that starts within a second was
started by a wake (or a handoff), never by a poll.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_the_claim_key_is_the_same_for_the_same_filters_in_any_order():
    from leasing.sql.terms import ClaimFilters
    from leasing.worker.leadership import claim_key

    one = ClaimFilters(work_types=("a", "b"), queues=("q1", "q2"))
    same = ClaimFilters(work_types=("b", "a"), queues=("q2", "q1"))
    assert claim_key(one) == claim_key(same)
    assert claim_key(one) != claim_key(ClaimFilters(work_types=("a", "b"), queues=("q1",)))
    assert claim_key(one) != claim_key(ClaimFilters(work_types=("a",), queues=("q1", "q2")))
    assert claim_key(ClaimFilters()) != claim_key(one)
