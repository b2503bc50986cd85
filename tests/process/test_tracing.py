"""Tracing across processes: the trace context a view stores with an item is continued by a
real `runworker` process (its spans exported to a file), on SQLite and PostgreSQL; and a
worker with tracing off never imports opentelemetry."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from leasing.models import WorkItem
from tests.support.tracing import TRACE_FILE_ENV, memory_exporter, read_trace_file, span_record
from tests.support.workers import leasing_env

pytest.importorskip("opentelemetry.sdk")
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_process_continues_the_trace_of_the_view_that_enqueued(
    spawn, tmp_path, leasing_settings, client
):
    from opentelemetry import trace

    leasing_settings(TRACING=True)
    exporter = memory_exporter()
    exporter.clear()
    with (
        override_settings(ROOT_URLCONF="tests.testapp.urls"),
        trace.get_tracer("tests").start_as_current_span("POST /traced/") as request,
    ):
        response = client.post("/traced/", {"task_id": "proc"}, content_type="application/json")
    item_id = response.json()["work_item_id"]
    send = next(
        span_record(s) for s in exporter.get_finished_spans() if s.name == "enqueue default"
    )

    trace_file = tmp_path / "spans.jsonl"
    proc = spawn(
        "manage.py",
        "runworker",
        "--burst",
        env={TRACE_FILE_ENV: str(trace_file), **leasing_env()},
    )
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert WorkItem.objects.get(pk=item_id).status == "completed"

    spans = read_trace_file(str(trace_file))
    names = sorted(s["name"] for s in spans)
    assert names == [
        "checkpoint",
        "checkpoint",
        "claim default",
        "run default",
        "run_once",
        "settle default",
    ]
    trace_id = f"{request.get_span_context().trace_id:032x}"
    assert {s["trace_id"] for s in spans} == {trace_id}
    run = next(s for s in spans if s["name"] == "run default")
    assert run["parent_id"] == send["span_id"]
    assert run["attributes"]["messaging.message.id"] == item_id
    for child in (s for s in spans if s["name"] in ("checkpoint", "run_once", "settle default")):
        assert child["parent_id"] == run["span_id"]
    settle = next(s for s in spans if s["name"] == "settle default")
    assert settle["attributes"]["leasing.ending"] == "completed"


def test_a_worker_with_tracing_off_imports_nothing_from_opentelemetry(spawn):
    proc = spawn("-m", "tests.procs.tracing_off")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {"status": "completed", "opentelemetry": []}


def test_a_cancelled_run_ends_cancelled_in_its_trace(spawn, tmp_path, leasing_settings):
    from leasing import cancel, enqueue
    from tests.support.helpers import row, wait_for

    leasing_settings(TRACING=True)
    record, trace_file = tmp_path / "runs.txt", tmp_path / "spans.jsonl"
    item = enqueue("c", "test.until_cancelled", {"seconds": 60})
    proc = spawn(
        "manage.py",
        "runworker",
        env={
            "LEASING_TEST_RECORD": str(record),
            TRACE_FILE_ENV: str(trace_file),
            **leasing_env(HEARTBEAT_INTERVAL=0.5, LEASE_DURATION=30),
        },
    )
    try:
        wait_for(lambda: record.exists() and "start" in record.read_text())
        cancel(item.pk, actor="ops", reason="stop it")
        wait_for(lambda: row(item.pk)["status"] == "cancelled", timeout=10)
        wait_for(
            lambda: any(s["name"] == "settle default" for s in read_trace_file(str(trace_file)))
        )
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    spans = read_trace_file(str(trace_file))
    run = next(s for s in spans if s["name"] == "run default")
    settle = next(s for s in spans if s["name"] == "settle default")
    assert run["status"] == "ERROR"  # the handler's checkpoint raised Cancelled
    assert settle["parent_id"] == run["span_id"]
    assert settle["attributes"]["leasing.ending"] == "cancelled"
    assert settle["events"] == ["leasing.cancelled"]


def test_a_process_mode_run_is_traced_in_its_child_under_the_enqueuers_trace(
    spawn, tmp_path, leasing_settings
):
    """The child makes the run span around the handler: its checkpoint and run_once spans
    (made in the child) nest under it, it continues the enqueue's trace, and the worker's
    settle span is its child."""
    from opentelemetry import trace

    from leasing import enqueue
    from tests.support.helpers import recorded, row, wait_for

    leasing_settings(TRACING=True)
    exporter = memory_exporter()
    exporter.clear()
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        item = enqueue("p", "test.process_work", {"n": 1})
    send = next(
        span_record(s) for s in exporter.get_finished_spans() if s.name == "enqueue default"
    )

    record, trace_file = tmp_path / "runs.txt", tmp_path / "spans.jsonl"
    proc = spawn(
        "manage.py",
        "runworker",
        env={
            "LEASING_TEST_RECORD": str(record),
            "LEASING_TEST_PROCESS_HANDLERS": "1",
            TRACE_FILE_ENV: str(trace_file),
            **leasing_env(HEARTBEAT_INTERVAL=0.3, LEASE_DURATION=30),
        },
    )
    try:
        wait_for(lambda: row(item.pk)["status"] == "completed", timeout=60)
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    child_pid = int(recorded(record, "start")[0][3].removeprefix("pid="))
    assert child_pid != proc.pid

    spans = read_trace_file(str(trace_file))
    trace_id = f"{request.get_span_context().trace_id:032x}"
    assert {s["trace_id"] for s in spans} == {trace_id}
    run = next(s for s in spans if s["name"] == "run default")
    assert run["pid"] == child_pid
    assert run["parent_id"] == send["span_id"]
    assert run["attributes"]["messaging.message.id"] == item.pk
    checkpoint = next(s for s in spans if s["name"] == "checkpoint")
    run_once = next(s for s in spans if s["name"] == "run_once")
    assert checkpoint["pid"] == run_once["pid"] == child_pid
    assert checkpoint["parent_id"] == run["span_id"]
    assert run_once["parent_id"] == run["span_id"]
    claim = next(s for s in spans if s["name"] == "claim default")
    assert claim["parent_id"] == send["span_id"]
    # The worker writes the ending, under the child's run span.
    settle = next(s for s in spans if s["name"] == "settle default")
    assert settle["pid"] == proc.pid
    assert settle["parent_id"] == run["span_id"]
    assert settle["attributes"]["leasing.ending"] == "completed"
