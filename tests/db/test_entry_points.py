"""Bad input to a public entry point: a clear error, nothing written, never a 500 (issue 39).

* The Schedules admin: a payload with a lone surrogate (the re-rendered form
  could not be encoded) or nested 100,000 deep (RecursionError), a payload
  that fits alone but not with the `_schedule` entry each tick adds, and a
  selected id that is not an id (the Enable/Disable actions), each answered
  with a form error or a message.
* `using=` of every public function that takes one: an unknown alias or a
  non-string is `InvalidInput` naming the aliases (one validator,
  `validation.database_alias`), before any row is read or written.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

import leasing
from leasing import InvalidInput
from leasing.models import Checkpoint, IdempotencyKey, Pause, Schedule, WorkItem
from leasing.services import schedules as schedule_service
from leasing.services.retention import purge_finished_items
from leasing.ticks import parse_schedule
from tests.support.admin import make_user

pytestmark = pytest.mark.django_db

ADD = reverse("admin:leasing_schedule_add")
LIST = reverse("admin:leasing_schedule_changelist")
MIB = 1024 * 1024


def snapshot() -> tuple:
    """Every row an entry point here could write, to compare before and after."""
    return (
        sorted(WorkItem.objects.values_list("pk", "status", "lease_token")),
        Checkpoint.objects.count(),
        IdempotencyKey.objects.count(),
        sorted(Pause.objects.values_list("kind", "name", "resumed_at")),
        sorted(Schedule.objects.values_list("name", "enabled", "payload", "next_run_at")),
        LogEntry.objects.count(),
    )


@pytest.fixture
def admin_client() -> Client:
    # A 500 is a response here (not an exception), so the status is what is asserted.
    client = Client(raise_request_exception=False)
    client.force_login(make_user("root", superuser=True))
    return client


def form(**overrides: str) -> dict[str, str]:
    data = {
        "name": "digest",
        "work_type": "test.noop",
        "cron": "",
        "every": "3600",
        "timezone": "UTC",
        "payload": '{"to": "ops"}',
        "queue_name": "default",
        "missed": "skip",
        "enabled": "on",
    }
    return {**data, **overrides}


def payload_errors(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return " ".join(response.context["adminform"].form.errors.get("payload", []))


# --- the schedule form ---------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000

BAD_PAYLOADS = [
    # JSON text is ASCII; it decodes to a lone surrogate, which no database stores.
    pytest.param('{"to": "\\ud800"}', "lone surrogate", id="lone-surrogate"),
    pytest.param('{"\\udfff": 1}', "lone surrogate", id="lone-surrogate-key"),
    pytest.param('{"to": ' + DEEP + "}", "nested more than 100 levels", id="100000-deep"),
    pytest.param(
        '{"to": ' + "[" * 150 + "]" * 150 + "}", "nested more than 100 levels", id="150-deep"
    ),
    # Python's parser refuses an integer this long with a ValueError, not a syntax error.
    pytest.param('{"a": ' + "9" * 5000 + "}", "not valid JSON", id="5000-digit-int"),
    # Fits alone, not with the `_schedule` entry every tick's item gets: every tick
    # would be refused by the enqueue.
    pytest.param('{"to": "' + "x" * (MIB - 20) + '"}', "over the limit", id="too-large-with-tick"),
]


@pytest.mark.parametrize(("payload", "words"), BAD_PAYLOADS)
def test_a_bad_payload_on_the_add_form_is_a_field_error_and_writes_nothing(
    admin_client, payload, words
):
    before = snapshot()
    response = admin_client.post(ADD, form(payload=payload))
    assert words in payload_errors(response)
    assert snapshot() == before


@pytest.mark.parametrize(("payload", "words"), BAD_PAYLOADS)
def test_a_bad_payload_on_the_change_form_is_a_field_error_and_changes_nothing(
    admin_client, payload, words
):
    pk = schedule_service.save_schedule(
        parse_schedule("digest", {"work_type": "test.noop", "every": 3600, "payload": {"a": 1}})
    )
    before = snapshot()
    response = admin_client.post(
        reverse("admin:leasing_schedule_change", args=[pk]), form(payload=payload)
    )
    assert words in payload_errors(response)
    assert snapshot() == before


def test_the_form_shows_a_refused_payload_as_typed(admin_client):
    response = admin_client.post(ADD, form(payload='{"to": "\\ud800"}'))
    assert "lone surrogate" in payload_errors(response)
    assert "\\ud800" in response.content.decode()  # the text typed, escapes and all


def test_a_payload_at_the_limit_with_its_tick_entry_is_saved(admin_client):
    """The check counts the `_schedule` entry: a payload with room for it is accepted."""
    response = admin_client.post(ADD, form(payload='{"to": "' + "x" * (MIB - 400) + '"}'))
    assert response.status_code == 302, payload_errors(response)
    assert len(Schedule.objects.get().payload["to"]) == MIB - 400


# --- the Enable/Disable actions' selection -------------------------------------------------


@pytest.mark.parametrize("action", ["enable_selected", "disable_selected", "delete_selected"])
@pytest.mark.parametrize(
    "selected",
    [
        ["abc"],
        ["1", "abc"],
        ["-1"],
        ["1.5"],
        ["\u0661"],  # an Arabic-Indic digit: str.isdigit() says yes, the database says no
        ["99999999999999999999999"],  # past bigint
        ["9" * 5000],  # past int()'s digit limit
    ],
)
def test_an_action_on_ids_that_are_not_ids_is_refused_with_a_message(
    admin_client, action, selected
):
    pk = schedule_service.save_schedule(
        parse_schedule("digest", {"work_type": "test.noop", "every": 3600})
    )
    selected = [str(pk) if s == "1" else s for s in selected]
    before = snapshot()
    response = admin_client.post(
        LIST, {"action": action, "_selected_action": selected, "post": "yes"}, follow=True
    )
    assert response.status_code == 200
    messages = [str(m) for m in response.context["messages"]]
    assert any("not schedule ids" in m and "nothing was changed" in m for m in messages)
    assert snapshot() == before


def test_an_action_on_real_ids_still_works(admin_client):
    pk = schedule_service.save_schedule(
        parse_schedule("digest", {"work_type": "test.noop", "every": 3600})
    )
    response = admin_client.post(LIST, {"action": "disable_selected", "_selected_action": [pk]})
    assert response.status_code == 302
    assert not Schedule.objects.get().enabled


# --- using= of the public API ---------------------------------------------------------------


def _calls() -> dict[str, Callable[[Any], Any]]:
    """Each public function that takes `using=`, called with otherwise good arguments."""
    item = "01J0000000000000000000000A"
    return {
        "enqueue": lambda using: leasing.enqueue("t-1", "test.noop", using=using),
        "enqueue_many": lambda using: leasing.enqueue_many(
            [{"task_id": "t-1", "work_type": "test.noop"}], using=using
        ),
        "LeaseManager": lambda using: leasing.LeaseManager("w-1", using=using),
        "RecoverySweep": lambda using: leasing.RecoverySweep(using=using),
        "apply_action": lambda using: leasing.apply_action(
            "force_release", item, expected_token=None, actor="me", reason="r", using=using
        ),
        "run_once": lambda using: leasing.run_once("k-1", {"a": 1}, _must_not_run, using=using),
        "create_checkpoint": lambda using: leasing.create_checkpoint(
            "t-1", "iteration_end", {"i": 1}, using=using
        ),
        "checkpoints_for": lambda using: list(leasing.checkpoints_for("t-1", using=using)),
        "latest_checkpoint": lambda using: leasing.latest_checkpoint("t-1", using=using),
        "resume_state": lambda using: leasing.resume_state("t-1", using=using),
        "waiting_on": lambda using: leasing.waiting_on(item, using=using),
        "dependents_of": lambda using: leasing.dependents_of(item, using=using),
        "pause": lambda using: leasing.pause(queue="q", by="me", reason="r", using=using),
        "resume": lambda using: leasing.resume(queue="q", by="me", reason="r", using=using),
        "purge_finished_items": lambda using: purge_finished_items(timedelta(days=1), using=using),
        "sync_from_settings": lambda using: schedule_service.sync_from_settings([], using=using),
        "run_due": lambda using: schedule_service.run_due(using=using),
        "save_schedule": lambda using: schedule_service.save_schedule(
            parse_schedule("s", {"work_type": "test.noop", "every": 60}), using=using
        ),
        "set_enabled": lambda using: schedule_service.set_enabled([1], True, using=using),
        "delete_schedules": lambda using: schedule_service.delete_schedules([1], using=using),
    }


def _must_not_run() -> Any:
    raise AssertionError("run_once ran its function with a bad using")


@pytest.mark.parametrize("function", sorted(_calls()))
@pytest.mark.parametrize("using", ["nope", "", 3, None, b"default", ["default"]])
def test_a_bad_using_is_invalid_input_naming_the_aliases_and_writes_nothing(function, using):
    leasing.pause(queue="q", by="me", reason="set up a pause to resume")
    before = snapshot()
    with pytest.raises(InvalidInput) as info:
        _calls()[function](using)
    message = str(info.value)
    assert "using must name a database alias of settings.DATABASES ('default'" in message
    assert repr(using) in message
    assert snapshot() == before
