"""Typed settings (leasing.conf) and system checks (leasing.checks)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from leasing.checks import check_settings


def test_check_rejects_heartbeat_not_below_lease(settings, db):
    settings.LEASING = {"LEASE_DURATION": 30, "HEARTBEAT_INTERVAL": 30, "SWEEP_INTERVAL": 6}
    assert [m.id for m in check_settings()] == ["leasing.E002"]
    with pytest.raises(SystemCheckError, match=r"leasing\.E002"):
        call_command("check")
