"""`manage.py seed_demo`: the demo data set (fixtures/demo.json) on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from leasing import console as dashboard
from leasing.models import (
    Checkpoint,
    CheckpointType,
    IdempotencyKey,
    Worker,
    WorkItem,
    WorkItemStatus,
)
from tests.support.admin import dashboard_url, make_user, timeline_url
from tests.support.helpers import ROOT, database_now
from tests.support.transition_guard import arranging

pytestmark = pytest.mark.django_db

FIXTURE = ROOT / "fixtures" / "demo.json"


def seed(*args: str) -> str:
    out = StringIO()
    if "--fresh" in args:
        # --fresh wipes every row first: a reset of the demo, not a transition.
        with arranging():
            call_command("seed_demo", *args, stdout=out)
    else:
        call_command("seed_demo", *args, stdout=out)
    return out.getvalue()


def counts() -> tuple[int, int, int, int]:
    return (
        WorkItem.objects.count(),
        Checkpoint.objects.count(),
        IdempotencyKey.objects.count(),
        Worker.objects.count(),
    )


def test_demo_data_covers_every_status_type_and_lease_state():
    seeded_at = database_now()
    output = seed("--fresh")
    assert "Loaded the demo data set" in output

    statuses = set(WorkItem.objects.values_list("status", flat=True))
    # `expired` is allowed by the CHECK constraint but nothing stores it.
    assert statuses == set(WorkItemStatus.values) - {WorkItemStatus.EXPIRED}
    types = set(Checkpoint.objects.values_list("checkpoint_type", flat=True))
    assert types == set(CheckpointType.values)

    items = WorkItem.objects
    assert items.healthy().exists()
    assert items.stale().exists()
    assert items.expired().exists()  # awaiting the sweep
    assert items.without_progress().exists()
    assert items.deferred().exists()  # waiting for a retry backoff
    assert items.finished().filter(retry_count__gt=0).exists()
    assert items.failed().filter(error_message="Max retries exceeded").exists()
    # Tokens are what real claims leave: one per attempt.
    retried = items.completed().filter(retry_count=2).first()
    assert retried.lease_token == 3

    health = dashboard.lease_health()
    assert health.stale >= 1 and health.expired >= 1 and health.no_progress >= 1
    workers = dict(Worker.objects.values_list("worker_id", "status"))
    assert {"running", "lost", "stopped"} <= set(workers.values())
    # As seeded: the demo's last pass is 25 s old and the sweep runs every 30 s, so on
    # a loaded host the checks above can outlast the 20 s before it reads as late.
    sweep = dashboard.sweep_health(now=seeded_at)
    assert sweep.ok and sweep.sweepers[0].worker_id == "sweeper@demo-host-1"
    late = dashboard.sweep_health(now=seeded_at + timedelta(seconds=60))
    assert not late.ok and "later than expected" in late.message
    assert IdempotencyKey.objects.filter(response_data__isnull=False).exists()

    # The operator's retry and cancel went through the service: state_transition checkpoints.
    transitions = Checkpoint.objects.filter(checkpoint_type="state_transition")
    assert {(t.snapshot_data["action"], t.snapshot_data["actor"]) for t in transitions} == {
        ("retry", "demo-operator"),
        ("cancel", "demo-operator"),
    }
    # Completions spread over the last hour feed the throughput chart.
    assert dashboard.throughput(window_minutes=60).completed >= 150


def test_times_are_relative_to_the_database_clock():
    before = database_now()
    seed("--fresh")
    now = database_now()
    sweeper = Worker.objects.get(worker_id="sweeper@demo-host-1")
    # The fixture's -25 s, from the clock as the seed read it (between these two reads).
    assert before - timedelta(seconds=25) <= sweeper.last_scan_at <= now - timedelta(seconds=25)
    agent = WorkItem.objects.get(task_id="demo-agent-0042")
    assert agent.lease_expires_at - now > timedelta(seconds=200)
    first = Checkpoint.objects.filter(task_id="demo-agent-0042").order_by("sequence_number")
    seqs = list(first.values_list("sequence_number", "created_at"))
    assert [s for s, _ in seqs] == list(range(1, len(seqs) + 1))
    assert [c for _, c in seqs] == sorted(c for _, c in seqs)  # time order = sequence order


def test_loading_twice_needs_fresh_and_fresh_replaces():
    seed("--fresh")
    loaded = counts()
    with pytest.raises(CommandError, match="already loaded"):
        seed()
    assert counts() == loaded
    seed("--fresh")
    assert counts() == loaded


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        (
            json.dumps({"tasks": [{"task_id": "demo-x", "items": [{"key": "a", "status": "x"}]}]}),
            "unknown status 'x'",
        ),
        (
            json.dumps(
                {
                    "tasks": [
                        {
                            "task_id": "demo-x",
                            "work_type": "w",
                            "items": [{"key": "a", "status": "pending"}],
                            "checkpoints": [{"type": "coffee_break", "item": "a"}],
                        }
                    ]
                }
            ),
            "Unknown checkpoint type",
        ),
    ],
)
def test_bad_scenarios_fail_with_one_line_and_change_nothing(tmp_path, content, message):
    seed("--fresh")
    loaded = counts()
    path = tmp_path / "scenario.json"
    path.write_text(content)
    with pytest.raises(CommandError, match=message):
        seed("--fresh", "--scenario", str(path))
    assert counts() == loaded  # one transaction: the wipe was rolled back too


def test_missing_scenario_file():
    with pytest.raises(CommandError, match="Scenario file not found"):
        seed("--scenario", "/nonexistent/demo.json")


def test_the_dashboard_renders_the_demo_data():
    cache.clear()
    seed("--fresh")
    client = Client()
    client.force_login(make_user("root", superuser=True))
    html = client.get(dashboard_url()).content.decode()
    assert "Recovery sweep OK." in html
    assert "demo-worker-a" in html and "demo-worker-c" in html
    assert client.get(timeline_url("demo-agent-0042")).status_code == 200


def test_fixture_times_are_offsets():
    scenario = json.loads(FIXTURE.read_text())
    assert "offset in seconds" in scenario["time"]
    assert all(isinstance(t["items"], list) for t in scenario["tasks"])
