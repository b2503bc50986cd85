"""Tracing's settings, its system check and the console's reading of a stored trace context
(no database, no opentelemetry needed)."""

from __future__ import annotations

import pytest

from leasing import tracing
from leasing.checks import check_settings
from leasing.conf import read_settings


@pytest.mark.parametrize("value", [False, True, "link"])
def test_tracing_takes_true_false_or_link(value):
    conf, problems = read_settings({"TRACING": value})
    assert problems == () and conf.tracing == value


@pytest.mark.parametrize("value", [1, 0, "yes", None, "LINK"])
def test_any_other_tracing_value_is_leasing_e001(settings, value):
    settings.LEASING = {"TRACING": value}
    [error] = check_settings()
    assert error.id == "leasing.E001"
    assert "LEASING['TRACING'] must be True, False or 'link'" in error.msg


def test_trace_url_needs_its_placeholder_and_no_other(settings):
    conf, problems = read_settings({"TRACE_URL": "https://jaeger/trace/{trace_id}"})
    assert problems == () and conf.trace_url == "https://jaeger/trace/{trace_id}"
    for bad in ("https://jaeger/trace/", "https://x/{trace_id}/{span_id}", 3):
        settings.LEASING = {"TRACE_URL": bad}
        [error] = check_settings()
        assert error.id == "leasing.E001" and "TRACE_URL" in error.msg


def test_trace_url_is_a_web_link_never_a_script(settings):
    """The console renders it as a link: `javascript:` would run in the operator's session."""
    for good in ("http://jaeger:16686/trace/{trace_id}", "/traces/{trace_id}"):
        assert read_settings({"TRACE_URL": good})[0].trace_url == good
    for bad in ("javascript:alert(1)//{trace_id}", "JavaScript:x//{trace_id}", "data:{trace_id}"):
        settings.LEASING = {"TRACE_URL": bad}
        [error] = check_settings()
        assert error.id == "leasing.E001" and "must start with https://" in error.msg


def test_tracing_on_without_opentelemetry_is_warning_w010(settings, monkeypatch):
    settings.LEASING = {"TRACING": True}
    assert "leasing.W010" not in [m.id for m in check_settings()]
    monkeypatch.setattr(tracing, "installed", lambda: False)
    assert [m.id for m in check_settings()] == ["leasing.W010"]
    settings.LEASING = {"TRACING": False}
    assert check_settings() == []


def test_the_trace_id_of_a_stored_context():
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert tracing.trace_id({"traceparent": traceparent}) == "4bf92f3577b34da6a3ce929d0e0e4736"
    zero = "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
    not_hex = "00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    junks = [None, {}, {"traceparent": "junk"}, {"traceparent": 3}, "text"]
    for junk in [*junks, {"traceparent": zero}, {"traceparent": not_hex}]:
        assert tracing.trace_id(junk) is None
