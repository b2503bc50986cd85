"""The Tasks backend's MAX_RETRIES is bounded as every enqueue bounds max_retries (leasing.E013).

2147483648 or more passed `manage.py check`, then every `Task.enqueue()` raised
`InvalidInput: max_retries must be at most 2147483647` (each item's max_retries column is
an int4), and a worker ran the stored tasks of such a backend as if nothing were wrong.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from leasing.models import WorkItem
from tests.support.helpers import e013
from tests.support.workers import FAST_POLL
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

OPTION = "TASKS['default']['OPTIONS']['MAX_RETRIES']"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (2**31, "must be at most 2147483647, got 2147483648."),
        (2**63, "must be at most 2147483647, got 9223372036854775808."),
        (True, "must be an integer, got True."),
        (-1, "must be at least 0, got -1."),
        (3.0, "must be an integer, got 3.0."),
    ],
)
def test_a_max_retries_enqueue_would_refuse_is_e013_and_refused_before_writing(
    tasks_setting, value, words
):
    tasks_setting(default={"MAX_RETRIES": value})
    assert e013() == [f"{OPTION} {words}"]  # 2**31 and 2**63: no error
    # The backend refuses with the check's message (was InvalidInput from the enqueue).
    with pytest.raises(ImproperlyConfigured) as info:
        tasks.add.enqueue(1, 2)
    assert str(info.value) == f"{OPTION} {words}"
    with pytest.raises(ImproperlyConfigured, match="MAX_RETRIES"):
        tasks.add.get_result("01NOPE0000000000000000000")
    assert not WorkItem.objects.exists()


def test_the_largest_max_retries_an_item_stores_is_accepted(tasks_setting):
    tasks_setting(default={"MAX_RETRIES": 2**31 - 1})
    assert e013() == []
    result = tasks.add.enqueue(1, 2)
    assert WorkItem.objects.get(pk=result.id).max_retries == 2**31 - 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_fails_the_stored_tasks_of_such_a_backend_at_once_saying_why(
    tasks_setting, leasing_settings
):
    leasing_settings(**FAST_POLL, MAX_RETRIES=3, RETRY_BACKOFF_BASE=60)
    tasks_setting(default={})
    result = tasks.add.enqueue(1, 2)
    tasks_setting(default={"MAX_RETRIES": 2**31})  # the worker's settings: ran the task
    call_command("runworker", "--burst", stdout=StringIO())
    item = WorkItem.objects.get(pk=result.id)
    assert (item.status, item.retry_count) == ("failed", 0), item.error_message
    assert item.error_message.startswith(
        f"PermanentError: TASKS['default'] cannot run tasks: {OPTION} must be at most "
        "2147483647, got 2147483648. Fix it,"
    )
