"""tracing: what OpenTelemetry tracing (LEASING["TRACING"]) costs a worker and an enqueue.

One `runworker --burst` process drains M no-op items, alternating REPEATS
times: tracing off (the default; nothing of opentelemetry is imported) and
tracing on, with the items enqueued under a span (so each carries a trace
context to read and continue) and OpenTelemetry's SDK in the worker (a batch
span processor; the exporter drops the spans, so a collector's cost is not
counted). Per traced item the worker reads the stored context and makes the
claim, run and ending spans. The enqueue side: K single `enqueue()` calls
each way (a traced call opens a producer span and stores the context with
one more UPDATE in the same transaction), as microseconds per call.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from statistics import median
from typing import Any

from bench.benchapp.tracing import install_sdk, sdk_installed
from bench.common import progress
from bench.context import Bench
from bench.drain import drain_runworker
from bench.report import Row

REPEATS = 2
WORKERS = 1


@contextmanager
def _traced_here() -> Iterator[None]:
    """LEASING["TRACING"] on in the bench process, under one span (a request's, say)."""
    from django.conf import settings
    from django.test import override_settings
    from opentelemetry import trace

    with (
        override_settings(LEASING={**settings.LEASING, "TRACING": True}),
        trace.get_tracer("bench").start_as_current_span("bench request"),
    ):
        yield


def _enqueue_us(bench: Bench, k: int) -> float:
    """Microseconds per single enqueue() call, over k calls."""
    from leasing import enqueue

    bench.reset()
    start = time.perf_counter()
    for i in range(k):
        enqueue(f"enqueue-{i}", "bench.noop")
    elapsed = time.perf_counter() - start
    bench.reset()
    return round(elapsed * 1e6 / k, 1)


def run(bench: Bench) -> dict[str, Any]:
    if not sdk_installed():
        progress("  skipped: opentelemetry-sdk is not installed (pip install -e '.[test]')")
        return {"skipped": "opentelemetry-sdk is not installed"}
    install_sdk()
    m = bench.sizes.options_items
    traced_env = {**bench.env, "BENCH_TRACING": "1"}
    off: list[dict[str, Any]] = []
    on: list[dict[str, Any]] = []
    for _ in range(REPEATS):
        progress(f"  runworker x{WORKERS}: {m} items, tracing off")
        off.append(drain_runworker(bench, WORKERS, m))
        progress(f"    {off[-1]['jobs_per_s']} jobs/s")
        progress(f"  runworker x{WORKERS}: {m} items, tracing on")
        with _traced_here():
            on.append(drain_runworker(bench, WORKERS, m, env=traced_env))
        progress(f"    {on[-1]['jobs_per_s']} jobs/s")
    traced = bench.one("SELECT count(*) FROM work_items WHERE trace_context IS NOT NULL")
    k = max(100, m // 50)
    enqueue_off = _enqueue_us(bench, k)
    with _traced_here():
        enqueue_on = _enqueue_us(bench, k)
    rate_off = round(median(r["jobs_per_s"] for r in off), 1)
    rate_on = round(median(r["jobs_per_s"] for r in on), 1)
    return {
        "items": m,
        "workers": WORKERS,
        "repeats": REPEATS,
        "off": off,
        "on": on,
        # The last traced drain's items, each stored with its enqueuer's context.
        "traced_items": traced,
        "jobs_per_s_off": rate_off,
        "jobs_per_s_on": rate_on,
        "worker_cost": round(1 - rate_on / rate_off, 3) if rate_off else None,
        "enqueue_calls": k,
        "enqueue_us_off": enqueue_off,
        "enqueue_us_on": enqueue_on,
    }


def rows(r: dict[str, Any]) -> Iterator[Row]:
    if "skipped" in r:
        yield Row("tracing", f"skipped: {r['skipped']}")
        return
    n = r["workers"]
    yield Row(
        f"runworker x{n}, tracing off, jobs/s (median of {r['repeats']})",
        r["jobs_per_s_off"],
        absolute=True,
    )
    yield Row(
        f"runworker x{n}, tracing on, jobs/s (median of {r['repeats']})",
        r["jobs_per_s_on"],
        absolute=True,
    )
    if r["worker_cost"] is not None:
        yield Row("  cost of tracing a run (1 - on / off)", f"{r['worker_cost']:.1%}")
    yield Row("enqueue() one item, tracing off, us a call", r["enqueue_us_off"])
    yield Row("enqueue() one item, tracing on, us a call", r["enqueue_us_on"])
