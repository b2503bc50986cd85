"""The peers' virtualenv: built on first use from bench/requirements-peers.txt.

It lives in bench/.peers-venv (gitignored) and is rebuilt when the
requirements file changes. Nothing of the project is installed into it: the
peers' site (`bench.peers.site`) is found through PYTHONPATH.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT, BenchError, progress

REQUIREMENTS = ROOT / "bench" / "requirements-peers.txt"
VENV = ROOT / "bench" / ".peers-venv"
STAMP = VENV / ".requirements.sha256"


def peers_python() -> Path:
    """The peers' Python, after building or updating their virtualenv if needed."""
    python = VENV / "bin" / "python"
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if python.exists() and STAMP.exists() and STAMP.read_text().strip() == wanted:
        return python
    progress(f"  building the peers' virtualenv in {VENV} (first use, about a minute)")
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(VENV)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "-r", str(REQUIREMENTS)],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise BenchError(
                f"could not build the peers' virtualenv ({' '.join(step[:4])}...):\n"
                + (done.stderr or done.stdout)[-2000:]
            )
    STAMP.write_text(wanted + "\n")
    return python
