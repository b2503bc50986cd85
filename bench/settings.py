"""Settings of the benchmarks: the project's, plus the bench handlers (bench.benchapp).

The project's demo handlers stay installed on purpose: a real deployment has
work types with different lease durations, and `runworker` without
`--work-type` serves all of them.
"""

import json
import os

from project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]  # noqa: F405

# A scenario gives one subprocess its own LEASING keys as JSON (`Bench.leasing_env`),
# say LEASING_BENCH_SETTINGS='{"PREFETCH": 0}'.
if os.environ.get("LEASING_BENCH_SETTINGS"):
    LEASING = {**LEASING, **json.loads(os.environ["LEASING_BENCH_SETTINGS"])}  # noqa: F405

# The `tracing` scenario's traced workers: LEASING["TRACING"] on, an SDK that drops its spans.
if os.environ.get("BENCH_TRACING") == "1":
    from bench.benchapp.tracing import install_sdk

    LEASING = {**LEASING, "TRACING": True}
    install_sdk()
