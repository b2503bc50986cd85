"""`runworker --database ALIAS`, and the warning for a Tasks backend on another alias.

A backend whose OPTIONS['DATABASE'] named another alias passed `manage.py check`, and its
`Task.enqueue()` wrote there, but `runworker` had no `--database`: a burst worker claimed
nothing and the result stayed READY forever. A real worker process running such a task is
tests/process/test_tasks_other_database.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import django.tasks
import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.tasks import TaskBackendHandler
from django.tasks.checks import check_tasks

from leasing import enqueue
from leasing.models import Worker, WorkItem
from leasing.tasks import BACKEND_PATH

pytestmark = pytest.mark.django_db


@pytest.fixture
def other_alias(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A second alias "other" in DATABASES (a copy of the default's entry; never opened).

    Added in place: Django's connections read this very dict, and a settings override of
    DATABASES would not reach them."""
    monkeypatch.setitem(
        django_settings.DATABASES, "other", dict(connections["default"].settings_dict)
    )
    yield


def tasks_checks(settings: Any, monkeypatch: pytest.MonkeyPatch, **options: Any) -> list[Any]:
    """The leasing.W011 and leasing.E013 of `manage.py check` with these backends (Django's
    check of the Tasks backends: the whole run would also open the new alias)."""
    settings.TASKS = {
        "default": {"BACKEND": BACKEND_PATH, "QUEUES": []},
        **{
            alias: {"BACKEND": BACKEND_PATH, "QUEUES": [], "OPTIONS": {"DATABASE": database}}
            for alias, database in options.items()
        },
    }
    monkeypatch.setattr(django.tasks, "task_backends", TaskBackendHandler())
    return [m for m in check_tasks() if m.id in ("leasing.W011", "leasing.E013")]


def test_a_backend_on_another_alias_is_w011_naming_the_flags_and_the_console(
    other_alias, settings, monkeypatch
):
    [warning] = tasks_checks(settings, monkeypatch, elsewhere="other")  # was: nothing
    assert warning.id == "leasing.W011"
    assert not warning.is_serious()
    assert warning.msg == (
        "TASKS['elsewhere'] enqueues to database 'other', not the default: its tasks run only "
        "under `runworker --database other`, expired ones are recovered only by "
        "`recoverysweep --database other`, and the console and /metrics, which read the "
        "default database (or LEASING['READ_DATABASE']), do not show them."
    )
    assert "--database other" in warning.hint and '["leasing.W011"]' in warning.hint


def test_no_w011_for_the_default_alias_and_e013_alone_for_an_unknown_one(settings, monkeypatch):
    assert tasks_checks(settings, monkeypatch, explicit="default") == []
    [error] = tasks_checks(settings, monkeypatch, typo="nope")
    assert error.id == "leasing.E013"


def run(*args: str) -> None:
    call_command("runworker", "--burst", *args, stdout=StringIO(), stderr=StringIO())


@pytest.mark.parametrize("alias", ["nope", "", "DEFAULT"])
def test_an_unknown_database_is_one_line_and_nothing_is_claimed_or_registered(alias):
    item = enqueue("t", "test.noop")
    with pytest.raises(CommandError) as info:
        run("--database", alias)  # was: unrecognized arguments
    assert str(info.value) == (
        f"--database must name a database alias of settings.DATABASES ('default'), got {alias!r}."
    )
    assert not Worker.objects.exists()
    assert WorkItem.objects.get(pk=item.pk).status == "pending"


@pytest.mark.django_db(transaction=True)
def test_database_default_is_the_worker_without_the_flag():
    item = enqueue("t", "test.noop")
    run("--database", "default")
    assert WorkItem.objects.get(pk=item.pk).status == "completed"
