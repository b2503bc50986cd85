"""The fault run: real processes under faults, then the checker over their history.

`make test-faults` (FAULTS_SECONDS=240) and `make test-faults-short` (75 s,
what CI runs). With FAULTS_REPORT set, the Markdown report is also written
there (`make test-faults` writes docs/fault-run.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from .injector import FAULTS
from .run import ARTIFACTS, RunConfig, fault_run


def test_no_property_breaks_under_faults() -> None:
    report = fault_run(RunConfig.from_environment())
    print("\n" + report.text)
    (ARTIFACTS / "report.md").write_text(report.markdown)
    if os.environ.get("FAULTS_REPORT"):
        Path(os.environ["FAULTS_REPORT"]).write_text(report.markdown)
    # The run proves something only if the faults and the workload happened.
    assert set(report.faults) == set(FAULTS), report.text
    assert report.figures["completions"] > 0 and report.figures["ticks"] > 0, report.text
    assert report.figures["reclaimed_items"] > 0, report.text
    assert report.passed, report.text
