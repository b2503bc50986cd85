"""A NOTIFY listener that cannot connect says so once, at WARNING, not every second at DEBUG
(idle workers then poll: slower pickup, which an operator must be able to see)."""

from __future__ import annotations

import logging
import time

import psycopg

from leasing.worker import listener


def test_a_listener_that_cannot_connect_warns_once_per_streak(monkeypatch, caplog):
    def refused(using):
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(listener, "session_connection", refused)
    caplog.set_level(logging.DEBUG, logger="leasing.worker")
    notify = listener.NotifyListener("default", None, lambda: None).start()
    try:
        time.sleep(2.5)  # three tries, a second apart
    finally:
        notify.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "connection refused" in warnings[0].getMessage()
    assert "idle workers poll" in warnings[0].getMessage()
    assert sum(1 for r in caplog.records if "reconnecting" in r.getMessage()) >= 1
