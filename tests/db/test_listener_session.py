"""A worker's listener session is recognisable from its first statement (PostgreSQL).

Monitoring and the bench count listener sessions in `pg_stat_activity` by
their statements (`leasing.sql.wakes.LISTENING`). A worker whose executors are
full from its first claim does not try for the lead, so without a first
statement of its own its session showed no query at all and was not counted.
"""

from __future__ import annotations

import pytest

from leasing.worker.leadership import Leadership
from leasing.worker.listener import NotifyListener
from tests.support.helpers import wait_for
from tests.support.queries import listening_sessions as _listening

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_full_workers_listener_is_counted_as_one_from_its_first_statement():
    full = Leadership("test-key", has_room=lambda: False)  # never tries for the lead
    listener = NotifyListener("default", None, lambda: None, leadership=full).start()
    try:
        wait_for(lambda: _listening() == 1, timeout=10)
    finally:
        listener.stop()
    assert not full.leading
