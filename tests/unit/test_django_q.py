"""The sweep as a django-q2 scheduled task."""

from __future__ import annotations

import pytest

from leasing.sweep.schedule import (
    schedule_minutes,
)


@pytest.mark.parametrize(
    ("seconds", "minutes"), [(0.2, 1), (60, 1), (60.5, 2), (90, 2), (3600, 60)]
)
def test_intervals_round_up_to_whole_minutes(seconds, minutes):
    assert schedule_minutes(seconds) == minutes
