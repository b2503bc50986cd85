"""The management commands' flags: few, each explained, and a removed one answered with
what replaced it (usually the LEASING setting) in one line, never a traceback."""

from __future__ import annotations

import pytest
from django.core.management import load_command_class

pytestmark = pytest.mark.django_db


def removed(name: str) -> dict[str, str]:
    return dict(load_command_class("leasing", name).removed_flags)


@pytest.mark.django_db(transaction=True)
def test_a_removed_flag_on_the_command_line_exits_2_with_one_line(spawn):
    proc = spawn("manage.py", "runworker", "--poll-interval", "0.05", "--burst")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err == (
        "manage.py runworker: error: --poll-interval was removed: set LEASING['POLL_INTERVAL']\n"
    )
    assert out == ""
