"""The two pages a reader opens first stay short: depth goes into the docs site.

README.md at most 300 lines; BENCHMARKS.md at most 200, the latest run and its
targets only (findings go to docs/explanation/performance.md, old runs to git).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("name", "most"), [("README.md", 300), ("BENCHMARKS.md", 200)])
def test_the_page_stays_within_its_length(name, most):
    lines = (ROOT / name).read_text().splitlines()
    assert len(lines) <= most, f"{name} has {len(lines)} lines: move depth into docs/"
