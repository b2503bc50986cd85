"""OpenTelemetry's SDK for the tracing tests: one provider per process, spans kept in memory
(this process) or appended to a JSON-lines file (a worker subprocess, `LEASING_TEST_TRACE_FILE`).

The global tracer provider can be set once a process, so every test shares one and
clears its exporter.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

TRACE_FILE_ENV = "LEASING_TEST_TRACE_FILE"

_lock = threading.Lock()
_memory: Any = None


def memory_exporter() -> Any:
    """The in-memory exporter of this process's SDK provider (installed on first use)."""
    global _memory
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    with _lock:
        if _memory is None:
            _memory = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(_memory))
            trace.set_tracer_provider(provider)
    return _memory


def span_record(span: Any) -> dict[str, Any]:
    """What the tests read of a finished span, as plain data (hex ids)."""
    parent = span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": None if parent is None else f"{parent.span_id:016x}",
        "links": [
            f"{link.context.trace_id:032x}-{link.context.span_id:016x}" for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "events": [event.name for event in span.events],
        "status": span.status.status_code.name,
    }


def install_file_exporter(path: str) -> None:
    """A worker subprocess's SDK: each ended span appended to `path` as one JSON line."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class FileExporter(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            # With the process that ended each span (a worker or its process-mode child).
            pid = os.getpid()
            lines = "".join(json.dumps({**span_record(span), "pid": pid}) + "\n" for span in spans)
            with _lock, open(path, "a") as out:
                out.write(lines)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)


def read_trace_file(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]
