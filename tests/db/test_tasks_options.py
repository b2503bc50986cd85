"""The Tasks backend's OPTIONS that configure its handler, and unknown ones (leasing.E013).

A bad LEASE_DURATION or HEARTBEAT raised from `apps.ready()` (a traceback instead of
`manage.py check`), an unknown key was ignored, and a second leasing backend's own
LEASE_DURATION or HEARTBEAT silently lost to the first's.
"""

from __future__ import annotations

import re

import django.tasks
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskResultStatus

from leasing.handlers import registry
from leasing.models import WorkItem
from leasing.tasks import TASK_WORK_TYPE, run_task
from tests.support.helpers import e013
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

KNOWN = "Known options: DATABASE, HEARTBEAT, LEASE_DURATION, MAX_RETRIES."


def assert_refused(words: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=words):
        tasks.add.enqueue(1, 2)
    with pytest.raises(ImproperlyConfigured, match=words):
        tasks.add.get_result("01NOPE0000000000000000000")
    assert not WorkItem.objects.exists()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"LEASE_DURATION": -5}, "['LEASE_DURATION'] is -5, which the 'django.task' handler"),
        ({"LEASE_DURATION": "abc"}, "['LEASE_DURATION'] is 'abc'"),
        ({"LEASE_DURATION": True}, "['LEASE_DURATION'] is True"),
        ({"LEASE_DURATION": 10**12}, "['LEASE_DURATION'] is 1000000000000"),
        ({"LEASE_DURATION": float("nan")}, "['LEASE_DURATION'] is nan"),
        ({"HEARTBEAT": "bogus"}, "['HEARTBEAT'] is 'bogus'"),
        ({"HEARTBEAT": None}, "['HEARTBEAT'] is None"),
    ],
)
def test_a_bad_lease_duration_or_heartbeat_is_e013_not_a_traceback_from_ready(
    tasks_setting, options, words
):
    tasks_setting(default=options)  # raised LeasingConfigurationError
    [message] = e013()
    assert message.startswith("TASKS['default']['OPTIONS']") and words in message
    assert_refused(re.escape(message))
    # The handler is registered all the same, with the default for the bad option.
    spec = registry.get(TASK_WORK_TYPE)
    assert (spec.func, spec.lease_duration, spec.heartbeat) == (run_task, None, "thread")


@pytest.mark.parametrize(
    ("key", "close"),
    [
        ("MAX_RETRY", "MAX_RETRIES"),
        ("LEASE_DURATIONS", "LEASE_DURATION"),
        ("database", "DATABASE"),
        ("COLOUR", None),
    ],
)
def test_an_unknown_option_is_e013_naming_it_the_known_ones_and_a_close_match(
    tasks_setting, key, close
):
    tasks_setting(default={key: 3})  # was ignored
    [message] = e013()
    assert message.startswith(f"Unknown option TASKS['default']['OPTIONS'][{key!r}]. {KNOWN}")
    if close:
        assert message.endswith(f" Did you mean {close!r}?")
    else:
        assert "Did you mean" not in message
    assert_refused("Unknown option")


def test_only_the_unknown_key_among_good_ones_is_reported(tasks_setting):
    tasks_setting(
        default={"LEASE_DURATION": 600, "HEARTBEAT": "beat", "MAX_RETRIES": 0, "MAX_RETRY": 1}
    )
    assert e013() == [
        f"Unknown option TASKS['default']['OPTIONS']['MAX_RETRY']. {KNOWN} "
        "Did you mean 'MAX_RETRIES'?"
    ]
    spec = registry.get(TASK_WORK_TYPE)  # the good ones are registered
    assert (spec.lease_duration, spec.heartbeat) == (600.0, "beat")


def test_options_that_are_not_a_dict_are_e013(tasks_setting):
    tasks_setting(default=["LEASE_DURATION", 60])  # raised from ready() and from the check
    assert e013() == ["TASKS['default']['OPTIONS'] must be a dict, got list."]
    assert_refused("must be a dict")


def test_a_second_leasing_backend_with_its_own_lease_or_heartbeat_is_e013(tasks_setting):
    tasks_setting(
        default={"LEASE_DURATION": 60},
        other={"LEASE_DURATION": 120, "HEARTBEAT": "beat"},
    )
    messages = e013()  # the second's options were silently not applied
    assert len(messages) == 2, messages
    lease = next(m for m in messages if "LEASE_DURATION'] is" in m)
    assert lease.startswith(
        "TASKS['other']['OPTIONS']['LEASE_DURATION'] is 120, but the first leasing backend, "
        "TASKS['default'], gives 60.0: work type 'django.task' has one handler"
    )
    assert any(m.startswith("TASKS['other']['OPTIONS']['HEARTBEAT'] is 'beat'") for m in messages)
    spec = registry.get(TASK_WORK_TYPE)  # the first backend's
    assert (spec.lease_duration, spec.heartbeat) == (60.0, "thread")
    with pytest.raises(ImproperlyConfigured, match="first leasing backend"):
        django.tasks.task_backends["other"].enqueue(tasks.add, (1, 2), {})
    # The first backend is unaffected.
    assert tasks.add.enqueue(1, 2).status == TaskResultStatus.READY

    # A second backend that leaves them to the first, or gives the same values, agrees.
    for second in ({}, {"LEASE_DURATION": 60.0, "HEARTBEAT": "thread"}):
        tasks_setting(default={"LEASE_DURATION": 60}, other=second)
        assert e013() == [], second


def test_a_second_backends_lease_is_judged_against_the_first_leaving_it_unset(tasks_setting):
    tasks_setting(default={}, other={"LEASE_DURATION": 120})
    [message] = e013()
    assert "gives no LEASE_DURATION (the worker's lease)" in message
