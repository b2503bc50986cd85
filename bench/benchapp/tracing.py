"""OpenTelemetry's SDK for the `tracing` scenario, as a deployment would run it: a batch
span processor in front of an exporter. The exporter drops the spans (counting them), so
the figures are Leasing's cost of making them, not a collector's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

EXPORTED = [0]


def sdk_installed() -> bool:
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def install_sdk() -> None:
    """This process's global tracer provider (once a process)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class DroppingExporter(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            EXPORTED[0] += len(spans)
            return SpanExportResult.SUCCESS

    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
    trace.set_tracer_provider(provider)
