"""Pausing and resuming queues and work types: the API, the claim gate, the command."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

import leasing
from leasing import InvalidInput, LeaseManager, enqueue_many
from leasing.models import Pause
from leasing.services.completion import complete_and_claim
from leasing.services.terms import claim_terms
from leasing.sql.terms import ClaimFilters

pytestmark = pytest.mark.django_db


def enqueue(n: int, queue: str, work_type: str = "test.noop") -> None:
    enqueue_many(
        [
            {"task_id": f"{queue}-{work_type}-{i}", "work_type": work_type, "queue_name": queue}
            for i in range(n)
        ]
    )


def claimed_queues(n: int = 50, **filters) -> list[tuple[str, str]]:
    leases = LeaseManager("w").acquire_leases(n, **filters)
    return sorted({(lease.queue_name, lease.work_type) for lease in leases})


def test_a_paused_queue_is_not_claimed_until_resumed():
    enqueue(3, "emails")
    enqueue(3, "reports")
    state = leasing.pause(queue="emails", by="alice", reason="provider outage")
    assert state.paused and state.changed and state.paused_by == "alice"
    assert state.paused_at is not None
    assert claimed_queues() == [("reports", "test.noop")]
    assert LeaseManager("w").acquire_lease(queue_filter="emails") is None
    resumed = leasing.resume(queue="emails", by="bob", reason="provider back")
    assert not resumed.paused and resumed.changed and resumed.resumed_by == "bob"
    assert claimed_queues() == [("emails", "test.noop")]


def test_a_paused_work_type_is_skipped_in_every_queue():
    enqueue(2, "a", "test.echo")
    enqueue(2, "b", "test.echo")
    enqueue(2, "a", "test.noop")
    leasing.pause(work_type="test.echo", by="ops", reason="bad deploy")
    assert claimed_queues() == [("a", "test.noop")]
    leasing.resume(work_type="test.echo", by="ops", reason="fixed")
    assert claimed_queues() == [("a", "test.echo"), ("b", "test.echo")]


def test_the_batch_path_honours_a_pause():
    enqueue(4, "q")
    manager = LeaseManager("w")
    held = manager.acquire_leases(1)
    leasing.pause(queue="q", by="ops", reason="stop")
    completion, claimed = complete_and_claim(
        manager, [(held[0], None)], 10, claim_terms(None), ClaimFilters()
    )
    assert len(completion.completed) == 1 and claimed == []


def test_pausing_twice_and_resuming_what_is_not_paused_change_nothing():
    first = leasing.pause(queue="q", by="a", reason="one")
    again = leasing.pause(queue="q", by="b", reason="two")
    assert not again.changed and again.paused and again.paused_by == "a"
    assert "already paused" in again.describe()
    assert Pause.objects.count() == 1 and first.changed
    leasing.resume(queue="q", by="c", reason="done")
    nothing = leasing.resume(queue="q", by="c", reason="done")
    assert not nothing.changed and not nothing.paused
    assert "was not paused" in nothing.describe()


def test_the_table_keeps_the_audit_trail_of_each_pause_and_resume():
    leasing.pause(queue="q", by="alice", reason="r1")
    leasing.resume(queue="q", by="bob", reason="r2")
    leasing.pause(queue="q", by="carol", reason="r3")
    rows = list(
        Pause.objects.order_by("id").values_list(
            "paused_by", "reason", "resumed_by", "resume_reason"
        )
    )
    assert rows == [("alice", "r1", "bob", "r2"), ("carol", "r3", None, None)]
    old, new = Pause.objects.order_by("id")
    assert old.resumed_at >= old.paused_at and new.active and not old.active


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of queue= or work_type="),
        ({"queue": "q", "work_type": "t"}, "exactly one of queue= or work_type="),
        ({"queue": ""}, "queue must be a non-empty string"),
        ({"queue": 3}, "queue must be a non-empty string"),
        ({"work_type": "x" * 256}, "work_type must be at most 255 characters"),
        ({"queue": "q", "by": ""}, "by must be a non-empty string"),
        ({"queue": "q", "reason": "  "}, "reason must be a non-empty string"),
        ({"queue": "q", "reason": None}, "reason must be a non-empty string"),
        ({"queue": "nul\x00"}, "queue"),
    ],
)
@pytest.mark.parametrize("action", [leasing.pause, leasing.resume])
def test_bad_input_is_refused_and_writes_nothing(action, kwargs, message):
    arguments = {"by": "ops", "reason": "why", **kwargs}
    with pytest.raises(InvalidInput, match=message):
        action(**arguments)
    assert Pause.objects.count() == 0


def call(*args: str) -> str:
    out = StringIO()
    call_command("pause", *args, stdout=out)
    return out.getvalue()


def test_the_command_pauses_lists_and_resumes(monkeypatch):
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setenv("LOGNAME", "alice")  # what getpass.getuser() reads first
    assert "Nothing is paused" in call()
    out = call("--queue", "emails", "--reason", "provider outage")
    assert out.strip() == "The queue 'emails' paused (by alice (manage.py pause): provider outage)."
    assert "queue 'emails': paused" in call()
    call("--work-type", "test.echo", "--reason", "bad deploy")
    monkeypatch.setenv("SUDO_USER", "bob")  # run as another user with sudo: who ran sudo
    out = call("--resume", "--queue", "emails", "--reason", "back")
    assert out.strip() == "The queue 'emails' resumed (by bob (sudo, manage.py pause): back)."
    assert list(Pause.objects.active().values_list("name", flat=True)) == ["test.echo"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queue", "q"], "--reason is required"),
        (["--queue", "q", "--reason", " "], "reason must be a non-empty string"),
        (["--queue", "x" * 300, "--reason", "r"], "at most 255 characters"),
        (["--resume"], "--resume and --reason need --queue or --work-type"),
        (["--list"], "--list was removed: run `manage.py pause` with neither"),
        (
            ["--queue", "q", "--reason", "r", "--by", "alice"],
            "--by was removed: the audit records the OS user",
        ),
    ],
)
def test_the_command_answers_bad_input_with_one_line_and_writes_nothing(args, message):
    with pytest.raises(CommandError, match=message) as info:
        call(*args)
    assert "\n" not in str(info.value)
    assert Pause.objects.count() == 0


def test_the_command_refuses_a_queue_and_a_work_type_together():
    with pytest.raises(CommandError, match="not allowed with argument"):
        call("--queue", "q", "--work-type", "t", "--reason", "r")
    with pytest.raises(CommandError, match="need --queue or --work-type"):
        call("--reason", "r")
    assert Pause.objects.count() == 0


def test_metrics_report_a_paused_queue(leasing_settings):
    from django.test import Client
    from prometheus_client.parser import text_string_to_metric_families

    leasing_settings(METRICS_TOKEN="t0ken")
    enqueue(1, "emails")
    enqueue(1, "reports")
    leasing.pause(queue="emails", by="ops", reason="outage")
    body = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken").content.decode()
    paused = {
        s.labels["queue"]: s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "leasing_queue_paused"
    }
    assert paused == {"emails": 1, "reports": 0}
