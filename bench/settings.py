"""Settings of the benchmarks: the project's, plus the bench handlers (bench.benchapp).

The project's demo handlers stay installed on purpose: a real deployment has
work types with different lease durations, and `runworker` without
`--work-type` serves all of them.
"""

from project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]  # noqa: F405
