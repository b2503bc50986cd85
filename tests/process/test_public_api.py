"""`from leasing import ...` works before and after `django.setup()`, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

import leasing
from tests.support.helpers import ROOT

pytestmark = pytest.mark.django_db

SCRIPT = """
import os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
setup_first = sys.argv[1] == "after"
if setup_first:
    import django
    django.setup()
import leasing
from leasing import {names}
values = [{names}]
assert all(v is not None for v in values)
if not setup_first:
    import django
    django.setup()
from leasing import enqueue, WorkContext, handler
assert callable(enqueue) and callable(handler) and isinstance(WorkContext, type)
assert leasing.enqueue is enqueue  # the function, never a submodule of that name
print("ok")
"""


@pytest.mark.parametrize("when", ["before", "after"])
def test_every_exported_name_imports_in_a_fresh_interpreter(when, subprocess_env):
    names = ", ".join(leasing.__all__)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(names=names), when],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
