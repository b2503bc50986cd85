"""OpenTelemetry tracing (LEASING["TRACING"]), with the SDK's in-memory exporter, on SQLite
and PostgreSQL: the enqueuer's context stored with the item, and one trace from an
enqueuing view to the run, its checkpoints, its run_once and its ending."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

import leasing
from leasing.models import WorkItem
from tests.support.tracing import memory_exporter, span_record
from tests.support.workers import FAST_POLL

pytest.importorskip("opentelemetry.sdk")


@pytest.fixture
def spans() -> Any:
    exporter = memory_exporter()
    exporter.clear()

    def finished() -> list[dict[str, Any]]:
        return [span_record(span) for span in exporter.get_finished_spans()]

    yield finished
    exporter.clear()


@pytest.fixture
def tracing_on(leasing_settings: Any) -> None:
    leasing_settings(TRACING=True, RETRY_BACKOFF_BASE=0.01, **FAST_POLL)


def tracer() -> Any:
    from opentelemetry import trace

    return trace.get_tracer("tests")


def burst() -> None:
    call_command("runworker", "--burst", "--concurrency", "1", stdout=StringIO())


def named(records: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [r for r in records if r["name"].split(" ")[0] == prefix]


def one(records: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    found = named(records, prefix)
    assert len(found) == 1, [r["name"] for r in records]
    return found[0]


@pytest.mark.django_db
def test_enqueue_stores_its_producer_spans_context_with_the_item(tracing_on, spans):
    with tracer().start_as_current_span("request") as request:
        item = leasing.enqueue("t1", "test.noop", queue_name="mail")

    send = one(spans(), "enqueue")
    assert send["name"] == "enqueue mail"
    assert send["kind"] == "PRODUCER"
    assert send["parent_id"] == f"{request.get_span_context().span_id:016x}"
    assert send["attributes"]["messaging.system"] == "leasing"
    assert send["attributes"]["messaging.destination.name"] == "mail"
    assert send["attributes"]["messaging.operation.type"] == "send"
    assert send["attributes"]["messaging.message.id"] == item.work_item_id
    stored = WorkItem.objects.get(pk=item.pk).trace_context
    assert stored["traceparent"].startswith(f"00-{send['trace_id']}-{send['span_id']}-")
    assert item.trace_context == stored


@pytest.mark.django_db
def test_a_batch_is_one_span_and_a_duplicate_keeps_its_first_enqueuers_context(tracing_on, spans):
    first = leasing.enqueue("t1", "test.noop", unique_key="k")
    stored = WorkItem.objects.get(pk=first.pk).trace_context
    items = leasing.enqueue_many(
        [
            {"task_id": "t1", "work_type": "test.noop", "unique_key": "k"},
            {"task_id": "t2", "work_type": "test.noop"},
        ]
    )
    assert items[0].duplicate and items[0].pk == first.pk
    assert WorkItem.objects.get(pk=first.pk).trace_context == stored
    batch = named(spans(), "enqueue")[-1]
    assert batch["attributes"]["messaging.batch.message_count"] == 2
    assert (
        WorkItem.objects.get(pk=items[1].pk).trace_context["traceparent"].split("-")[2]
        == (batch["span_id"])
    )


@pytest.mark.django_db(transaction=True)
def test_one_trace_from_the_enqueuing_view_to_the_run_its_checkpoints_and_its_ending(
    tracing_on, spans, client
):
    with (
        override_settings(ROOT_URLCONF="tests.testapp.urls"),
        tracer().start_as_current_span("POST /traced/") as request,
    ):
        response = client.post("/traced/", {"task_id": "view"}, content_type="application/json")
    assert response.status_code == 201
    item_id = response.json()["work_item_id"]
    burst()

    records = spans()
    trace_id = f"{request.get_span_context().trace_id:032x}"
    assert {r["trace_id"] for r in records if r["name"] != "POST /traced/"} == {trace_id}
    by_id = {r["span_id"]: r for r in records}
    send, claim, run = one(records, "enqueue"), one(records, "claim"), one(records, "run")
    assert by_id[send["parent_id"]]["name"] == "POST /traced/"
    assert claim["parent_id"] == send["span_id"] == run["parent_id"]
    assert run["kind"] == "CONSUMER"
    assert run["links"] == [f"{trace_id}-{send['span_id']}"]
    assert run["attributes"]["messaging.message.id"] == item_id
    assert run["attributes"]["messaging.destination.name"] == "default"
    assert run["attributes"]["leasing.attempt"] == 1
    checkpoints = named(records, "checkpoint")
    assert [c["attributes"]["leasing.checkpoint.type"] for c in checkpoints] == [
        "iteration_start",
        "iteration_end",
    ]
    run_once = one(records, "run_once")
    assert run_once["attributes"]["leasing.run_once.ran"] is True
    settle = one(records, "settle")
    for child in [*checkpoints, run_once, settle]:
        assert child["parent_id"] == run["span_id"]
    assert settle["attributes"]["leasing.ending"] == "completed"
    assert settle["events"] == ["leasing.completed"]
    assert WorkItem.objects.get(pk=item_id).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_failed_attempt_ends_retry_and_its_retry_replays_run_once(tracing_on, spans):
    item = leasing.enqueue("retry", "test.traced", input_data={"fail_first": True})
    burst()

    records = spans()
    runs = named(records, "run")
    assert [r["attributes"]["leasing.attempt"] for r in runs] == [1, 2]
    assert runs[0]["status"] == "ERROR" and runs[1]["status"] == "UNSET"
    endings = {r["parent_id"]: r["attributes"]["leasing.ending"] for r in named(records, "settle")}
    assert endings == {runs[0]["span_id"]: "retry", runs[1]["span_id"]: "completed"}
    # The worker's record of the failure, written after the handler's span ended, is the
    # failed run's too.
    [boundary] = [
        c
        for c in named(records, "checkpoint")
        if c["attributes"]["leasing.checkpoint.type"] == "error_boundary"
    ]
    assert boundary["parent_id"] == runs[0]["span_id"]
    # Both runs continue the one enqueue's trace.
    assert {r["trace_id"] for r in records} == {one(records, "enqueue")["trace_id"]}
    assert [r["attributes"]["leasing.run_once.ran"] for r in named(records, "run_once")] == [
        True,
        False,
    ]
    assert WorkItem.objects.get(pk=item.pk).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_run_that_fails_for_good_ends_failed(tracing_on, spans):
    leasing.enqueue("fail", "test.always_fail", max_retries=0)
    burst()

    records = spans()
    run = one(records, "run")
    assert run["status"] == "ERROR"
    assert "exception" in run["events"]
    assert one(records, "settle")["attributes"]["leasing.ending"] == "failed"


@pytest.mark.django_db(transaction=True)
def test_link_mode_starts_a_trace_per_run_linked_to_the_enqueuer(leasing_settings, spans):
    leasing_settings(TRACING="link", **FAST_POLL)
    leasing.enqueue("linked", "test.traced")
    burst()

    records = spans()
    send, run = one(records, "enqueue"), one(records, "run")
    assert run["parent_id"] is None
    assert run["trace_id"] != send["trace_id"]
    assert run["links"] == [f"{send['trace_id']}-{send['span_id']}"]
    assert one(records, "settle")["trace_id"] == run["trace_id"]


@pytest.mark.django_db(transaction=True)
def test_an_unreadable_stored_context_leaves_the_run_untraced_by_its_enqueuer(
    leasing_settings, spans
):
    leasing_settings(**FAST_POLL)  # tracing off: nothing stored
    item = leasing.enqueue("junk", "test.echo")
    WorkItem.objects.filter(pk=item.pk).update(trace_context={"traceparent": "not-a-context"})
    leasing_settings(TRACING=True, **FAST_POLL)
    burst()

    run = one(spans(), "run")
    assert run["parent_id"] is None and run["links"] == []
    assert WorkItem.objects.get(pk=item.pk).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_tracing_off_stores_nothing_and_makes_no_spans(leasing_settings, spans):
    leasing_settings(**FAST_POLL)
    with tracer().start_as_current_span("request"):
        item = leasing.enqueue("off", "test.traced")
    burst()

    assert [r["name"] for r in spans()] == ["request"]
    row = WorkItem.objects.get(pk=item.pk)
    assert row.trace_context is None and row.status == "completed"


@pytest.mark.django_db(transaction=True)
def test_run_once_outside_a_handler_says_whether_it_ran(tracing_on, spans):
    calls = []
    for _ in range(2):
        leasing.run_once("once", {"a": 1}, lambda: calls.append(1) or {"ok": True})
    assert calls == [1]
    assert [r["attributes"]["leasing.run_once.ran"] for r in named(spans(), "run_once")] == [
        True,
        False,
    ]


# --- the console ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_item_page_shows_the_trace_id_linked_by_trace_url(
    leasing_settings, spans, viewer_client
):
    from tests.support.admin import change_url

    leasing_settings(TRACING=True)
    traced = leasing.enqueue("t", "test.noop")
    trace_id = traced.trace_context["traceparent"].split("-")[1]
    html = viewer_client.get(change_url(traced.pk)).content.decode()
    assert f"<code>{trace_id}</code>" in html
    assert "https://jaeger" not in html

    leasing_settings(TRACING=True, TRACE_URL="https://jaeger.example/trace/{trace_id}")
    html = viewer_client.get(change_url(traced.pk)).content.decode()
    assert f'<a href="https://jaeger.example/trace/{trace_id}" rel="noopener">' in html

    leasing_settings(TRACING=False)
    untraced = leasing.enqueue("u", "test.noop")
    response = viewer_client.get(change_url(untraced.pk))
    assert response.status_code == 200
    assert "Tracing" not in response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_failure_to_trace_a_run_does_not_fail_the_run(tracing_on, spans, monkeypatch, caplog):
    from leasing import tracing

    def broken(api, lease, received):
        raise RuntimeError("an exporter's bug")

    monkeypatch.setattr(tracing, "_start_run", broken)
    item = leasing.enqueue("broken", "test.echo")
    burst()

    assert WorkItem.objects.get(pk=item.pk).status == "completed"
    assert named(spans(), "run") == []
    assert "runs untraced" in caplog.text


@pytest.mark.django_db
def test_a_refused_batch_writes_nothing_and_its_span_says_why(tracing_on, spans):
    from leasing.exceptions import InvalidInput

    with pytest.raises(InvalidInput, match="item 1"):
        leasing.enqueue_many(
            [{"task_id": "ok", "work_type": "test.noop"}, {"task_id": "bad", "work_type": ""}]
        )
    assert not WorkItem.objects.exists()
    send = one(spans(), "enqueue")
    assert send["status"] == "ERROR" and "exception" in send["events"]
    # Input the span reads before validation is refused by validation, not by the tracing.
    with pytest.raises(InvalidInput, match="queue_name"):
        leasing.enqueue("bad", "test.noop", queue_name=["a list"])


@pytest.mark.django_db(transaction=True)  # the signal goes out once the recovery commits
def test_a_lease_the_sweep_recovers_ends_in_its_items_trace(tracing_on, spans):
    from leasing import LeaseManager
    from tests.support.recovery import expire, sweep

    item = leasing.enqueue("expired", "test.noop", max_retries=3)
    LeaseManager("dead-worker").acquire_lease(lease_duration_seconds=30)
    expire(item.pk)
    sweep().scan_and_recover()

    records = spans()
    send, settle = one(records, "enqueue"), one(records, "settle")
    assert settle["parent_id"] == send["span_id"]
    assert settle["attributes"]["leasing.ending"] == "retry"
    assert settle["attributes"]["leasing.lease.expired"] is True
    assert settle["events"] == ["leasing.lease_expired", "leasing.retry"]


@pytest.mark.django_db
def test_with_tracing_off_the_sweep_is_not_followed(leasing_settings):
    from leasing import signals

    leasing_settings(TRACING=True)
    assert signals.listened(signals.lease_expired)
    leasing_settings(TRACING=False)
    assert not signals.listened(signals.lease_expired)
