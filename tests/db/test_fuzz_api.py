"""Property-based fuzzing of the Python API: bad input gets a clear error and writes nothing.

Hypothesis throws arbitrary text (lone surrogates, NUL, huge strings), numbers
and JSON-ish values at every public entry point. Each call either succeeds or
raises one of the app's own errors (`LeasingError`, which `InvalidInput`
is); never a driver error, a RecursionError or a TypeError from deep inside,
and a rejected call leaves every table as it was.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasing import (
    LeaseManager,
    create_checkpoint,
    enqueue,
    enqueue_many,
    resume_state,
    run_once,
)
from leasing.exceptions import LeasingError
from leasing.models import Checkpoint, IdempotencyKey, Worker, WorkItem
from leasing.services.operations import apply_action
from leasing.services.retention import parse_age

pytestmark = pytest.mark.django_db

# Text as an attacker (or a buggy caller) sends it: any code point, surrogates and NUL included.
TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=300) | st.just(
    "x" * 10_000
)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | TEXT
JSONISH = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=20,
)
ANYTHING = JSONISH | st.builds(object)
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def table_counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (WorkItem, Checkpoint, IdempotencyKey, Worker))


def call(fn: Any, *args: Any, **kwargs: Any) -> bool:
    """True if the call succeeded; False if it was refused with the app's own error."""
    try:
        fn(*args, **kwargs)
    except LeasingError:
        return False
    return True


@FUZZ
@given(task_id=TEXT, work_type=TEXT, input_data=ANYTHING, priority=SCALARS, queue=TEXT)
def test_enqueue(task_id, work_type, input_data, priority, queue):
    before = table_counts()
    ok = call(enqueue, task_id, work_type, input_data, priority=priority, queue_name=queue)
    assert table_counts() == (before if not ok else (before[0] + 1, *before[1:]))


@FUZZ
@given(
    items=st.lists(
        st.dictionaries(st.sampled_from(["task_id", "work_type", "input_data", "x"]), ANYTHING),
        max_size=3,
    )
    | ANYTHING
)
def test_enqueue_many(items):
    before = table_counts()
    if not call(enqueue_many, items):
        assert table_counts() == before


@FUZZ
@given(
    task_id=TEXT,
    checkpoint_type=TEXT | st.just("manual_checkpoint"),
    snapshot=ANYTHING,
    metadata=ANYTHING,
)
def test_create_checkpoint(task_id, checkpoint_type, snapshot, metadata):
    before = table_counts()
    if not call(create_checkpoint, task_id, checkpoint_type, snapshot, metadata=metadata):
        assert table_counts() == before
    call(resume_state, task_id)


@FUZZ
@given(key=TEXT, request=ANYTHING, response=ANYTHING, task_id=TEXT | st.none())
def test_run_once(key, request, response, task_id):
    completed = IdempotencyKey.objects.filter(status="completed").count()
    if not call(run_once, key, request, lambda: response, task_id=task_id):
        # A refused key or request writes nothing; a refused response leaves the
        # key `failed` (the effect ran but could not be stored), never completed.
        assert IdempotencyKey.objects.filter(status="completed").count() == completed


@FUZZ
@given(
    worker_id=TEXT,
    duration=SCALARS,
    work_type=TEXT | st.lists(TEXT, max_size=3) | st.none(),
    queue=TEXT | st.none(),
    task=TEXT | st.none(),
)
def test_claims(worker_id, duration, work_type, queue, task):
    enqueue("fuzz", "test.echo")
    before = table_counts()
    try:
        manager = LeaseManager(worker_id)
    except LeasingError:
        return
    call(manager.acquire_lease, duration, work_type, task, queue)
    assert table_counts() == before


@FUZZ
@given(item_id=TEXT, token=SCALARS, output=ANYTHING, error=ANYTHING, success=SCALARS, retry=SCALARS)
def test_release_and_renew(item_id, token, output, error, success, retry):
    manager = LeaseManager("fuzzer")
    before = table_counts()
    call(manager.renew_lease, item_id, token=token if isinstance(token, int) else None)
    call(manager.release_lease, item_id, success, output, error, retry)
    call(manager.requeue_lease, item_id)
    assert table_counts() == before


@FUZZ
@given(
    action=TEXT | st.sampled_from(["force_release", "force_fail", "retry"]),
    item_id=TEXT,
    token=SCALARS,
    actor=TEXT,
    reason=TEXT,
)
def test_operator_actions(action, item_id, token, actor, reason):
    before = table_counts()
    call(apply_action, action, item_id, expected_token=token, actor=actor, reason=reason)
    assert table_counts() == before


@FUZZ
@given(text=TEXT)
def test_ages(text):
    call(parse_age, text)
