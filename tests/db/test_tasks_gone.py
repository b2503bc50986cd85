"""A stored task whose backend or code changed since it was enqueued fails at once.

The site removed or renamed the item's backend alias, pointed it at another backend,
or deployed code without the task (or with it changed): every attempt would fail the
same way, so the worker fails the item on its first attempt, saying what is wrong and
what to do. Before, a removed alias (InvalidTaskBackend), a backend that cannot be
loaded or is misconfigured (ImproperlyConfigured), Django's ImmediateBackend
(NotImplementedError) and changed parameters (TypeError) were retried MAX_RETRIES
times, and the other cases failed with a bare import error or result id.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import django.tasks
import pytest
from django.core.management import call_command
from django.tasks import TaskBackendHandler, TaskResultStatus, default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist

from leasing.exceptions import PermanentError
from leasing.models import WorkItem
from leasing.tasks import BACKEND_PATH
from tests.support.workers import FAST_POLL
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

LEASING = {"BACKEND": BACKEND_PATH, "QUEUES": []}


@pytest.fixture(autouse=True)
def retries(leasing_settings):
    # Retried, an item would wait out a backoff longer than the burst worker runs.
    leasing_settings(**FAST_POLL, MAX_RETRIES=3, RETRY_BACKOFF_BASE=60)


@pytest.fixture
def tasks_setting(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Set TASKS to these backends (alias=config), as a site's settings.py would."""

    def apply(**backends: Any) -> None:
        settings.TASKS = backends
        monkeypatch.setattr(django.tasks, "task_backends", TaskBackendHandler())

    return apply


def drain() -> None:
    call_command("runworker", "--burst", stdout=StringIO())


def failed_at_once(result_id: str, words: str) -> WorkItem:
    item = WorkItem.objects.get(pk=result_id)
    assert (item.status, item.retry_count) == ("failed", 0), item.error_message
    assert words in item.error_message
    assert "retry the item" in item.error_message
    return item


@pytest.mark.parametrize(
    ("other", "words"),
    [
        (None, "TASKS has no backend 'other' any more"),
        (
            {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
            "TASKS['other'] is now 'django.tasks.backends.immediate.ImmediateBackend', "
            "not 'leasing.tasks.LeasingBackend'",
        ),
        (
            {"BACKEND": "django.tasks.backends.dummy.DummyBackend"},
            "TASKS['other'] is now 'django.tasks.backends.dummy.DummyBackend'",
        ),
        ({"BACKEND": "nowhere.Backend"}, "TASKS['other'] cannot be loaded"),
        (
            {**LEASING, "OPTIONS": {"MAX_RETRIES": -1}},
            "TASKS['other'] cannot run tasks: TASKS['other']['OPTIONS']['MAX_RETRIES']",
        ),
    ],
    ids=["removed", "immediate", "dummy", "unimportable", "misconfigured"],
)
def test_a_task_whose_backend_alias_is_gone_or_changed_fails_at_once(tasks_setting, other, words):
    tasks_setting(default=LEASING, other=LEASING)
    result = tasks.add.using(backend="other").enqueue(1, b=2)
    tasks_setting(default=LEASING, **({} if other is None else {"other": other}))
    drain()
    item = failed_at_once(result.id, words)
    # The item stays readable through the backends it still has.
    result = tasks.add.get_result(result.id)
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class is PermanentError
    assert item.error_message in error.traceback


MODULE = "deployed_tasks"
ADD = """\
    from django.tasks import task


    @task
    def add(a, b):
        return a + b
    """


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Write module `deployed_tasks` as a deploy would (None: remove it); import it if
    asked (a worker imports it when it runs the task)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no stale .pyc of a rewrite
    path = tmp_path / f"{MODULE}.py"

    def write(source: str | None, *, load: bool = False) -> Any:
        sys.modules.pop(MODULE, None)
        if source is None:
            path.unlink()
        else:
            path.write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        return importlib.import_module(MODULE) if load else None

    yield write
    sys.modules.pop(MODULE, None)


GONE = [
    (None, "module 'deployed_tasks' does not exist any more"),
    (ADD.replace("def add", "def plus"), "module 'deployed_tasks' has no 'add' any more"),
    (ADD.replace("    @task\n", ""), "'deployed_tasks.add' is no longer a Task"),
    (
        "    import no_such_dependency_of_leasing_tests\n" + ADD,
        "importing module 'deployed_tasks' raised ModuleNotFoundError: "
        "No module named 'no_such_dependency_of_leasing_tests'",
    ),
]


@pytest.mark.parametrize(
    ("source", "words"), GONE, ids=["module-removed", "renamed", "not-a-task", "import-fails"]
)
def test_a_task_whose_code_is_gone_fails_at_once_and_says_so(deploy, source, words):
    result = deploy(ADD, load=True).add.enqueue(1, b=2)
    deploy(source)
    drain()
    item = failed_at_once(result.id, words)
    # No TaskResult can be built without its Task: get_result() says why.
    with pytest.raises(TaskResultDoesNotExist) as raised:
        default_task_backend.get_result(result.id)
    assert item.error_message.removeprefix("PermanentError: ") in str(raised.value)


def test_a_task_whose_parameters_changed_fails_at_once_without_running(deploy):
    """The stored arguments no longer bind: a TypeError, retried MAX_RETRIES times."""
    result = deploy(ADD, load=True).add.enqueue(1, b=2)
    changed = ADD.replace("(a, b)", "(a, c)").replace("a + b", "RUNS.append(a)")
    module = deploy(changed.replace("import task\n", "import task\n    RUNS = []\n"), load=True)
    drain()
    item = failed_at_once(result.id, "'deployed_tasks.add' no longer accepts the arguments")
    assert "(missing a required argument: 'c')" in item.error_message
    assert module.RUNS == []
    result = module.add.get_result(result.id)
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class is PermanentError
