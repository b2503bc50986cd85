"""Modules a fresh interpreter may import first, before Django is set up, import cleanly.

A process-mode child (multiprocessing's spawn) unpickles its target, importing
`leasing.worker` before anything else: an import cycle that the usual order hides
(validation -> conf -> setting_entries -> validation) failed every child at start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST = (
    "leasing.worker",
    "leasing.worker.child",
    "leasing.validation",
    "leasing.conf",
    "leasing.setting_entries",
)


@pytest.mark.parametrize("module", FIRST)
def test_the_module_imports_first_in_a_fresh_interpreter(module):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
